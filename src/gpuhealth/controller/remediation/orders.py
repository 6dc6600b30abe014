"""The life of one agent order inside an episode's status (pure): sent, maybe not delivered
(no live stream: sent again after ``undelivered_retry_s``), reported on by the agent
(``accepted``, ``running``, ``succeeded``, ``failed``, ``refused``), and sent again with the
same id when no report came within its timeout (the agent answers a repeat with the result it
has). An aborted episode replaces an order still in flight with its cancel
(:func:`cancel_of`), sent until the agent acknowledges it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

from gpuhealth.controller.remediation.model import OrderStatus, Status, clip
from gpuhealth.protocol.remediation import (
    ActionReport,
    CancelOrder,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)

OrderKind = Literal["reset-gpu", "reboot", "validate", "cancel"]


UNNUMBERED = 0
"""The ``seq`` of an order a step builds: the stream numbers each order it sends on a
connection (``assembly.StreamOrders``), and stamps ``issued_at`` when it sends it."""


ORDER_KINDS: dict[type[Order], OrderKind] = {
    ResetGpuOrder: "reset-gpu",
    RebootOrder: "reboot",
    ValidateOrder: "validate",
    CancelOrder: "cancel",
}


def order_id(fingerprint: str, kind: str, attempt: int) -> str:
    return f"{fingerprint}-{kind}-{attempt}"


DONE_STATES = frozenset({"succeeded", "failed", "refused"})
CANCELLABLE = frozenset({"reset-gpu", "reboot", "validate"})
"""Orders an abort cancels while they are in flight (a reboot in its delay included)."""
CANCEL_SUFFIX = "-cancel"


def in_flight(order: OrderStatus | None) -> bool:
    """Sent and not finished: the agent may be executing it, or may still receive it (a
    reboot ``accepted`` waits out its delay before rebooting)."""
    return order is not None and order.action in CANCELLABLE and order.state not in DONE_STATES


def cancel_of(order: OrderStatus, now: datetime) -> OrderStatus:
    """The cancel of ``order`` as the status keeps it: id ``<order id>-cancel``."""
    return OrderStatus(id=order.id + CANCEL_SUFFIX, action="cancel", sent_at=now)


def cancel_order(cancel: OrderStatus, episode: str, now: datetime) -> CancelOrder:
    """The protocol frame of a cancel kept by :func:`cancel_of`."""
    return CancelOrder(
        seq=UNNUMBERED,
        order_id=cancel.id,
        episode=episode,
        issued_at=now,
        cancel_order_id=cancel.id.removesuffix(CANCEL_SUFFIX),
    )


def current_order(st: Status, kind: str) -> OrderStatus | None:
    return st.order if st.order is not None and st.order.action == kind else None


def absorb_report(order: OrderStatus | None, report: ActionReport | None) -> OrderStatus | None:
    """The order with the agent's latest word on it (older or foreign reports ignored)."""
    if order is None or report is None or report.order_id != order.id:
        return order
    if order.reported_at is not None and report.at < order.reported_at:
        return order
    if order.state in DONE_STATES and report.state not in DONE_STATES:
        return order  # a late "running" never undoes a result
    return msgspec.structs.replace(
        order,
        state=report.state,
        reason=report.reason,
        message=clip(report.message),
        reported_at=report.at,
        delivered=True,
    )


def new_order(fingerprint: str, kind: str, attempt: int, now: datetime) -> OrderStatus:
    return OrderStatus(
        id=order_id(fingerprint, kind, attempt), action=kind, attempt=attempt, sent_at=now
    )


def resend_due(
    order: OrderStatus, now: datetime, timeout_s: float, undelivered_s: float
) -> float | None:
    """0 when the same order should go out again now, else seconds until it may (None:
    never, it has a result)."""
    if order.state in DONE_STATES:
        return None
    sent = order.sent_at or now
    wait_s = timeout_s if order.delivered else min(undelivered_s, timeout_s)
    due = sent + timedelta(seconds=wait_s)
    return max(0.0, (due - now).total_seconds())


def resent(order: OrderStatus, now: datetime) -> OrderStatus:
    return msgspec.structs.replace(order, sent_at=now, delivered=False)


def mark_delivered(st: Status, order_id_: str) -> Status:
    """Record that the order reached a live agent stream."""
    order = st.order
    if order is None or order.id != order_id_ or order.delivered:
        return st
    return msgspec.structs.replace(st, order=msgspec.structs.replace(order, delivered=True))
