"""Remediating: order the GPU reset or the reboot, and see it done.

A reset is done when the agent reports it ``succeeded``; a refusal (``gpu-busy`` ...) or a
failure is retried after ``retry_s`` up to ``max_attempts``, then escalates. A reboot is
done when the node's boot id differs from the one recorded when the drain finished and the
agent reports again; with ``executor: external`` nothing is sent (the GPURemediation in
Remediating is the hand-off to a cloud/BMC integration).
"""

from __future__ import annotations

from datetime import datetime

from gpuhealth.controller.remediation.actions import Act, SendOrder
from gpuhealth.controller.remediation.deadlines import deadline, earliest, seconds_until
from gpuhealth.controller.remediation.escalation import escalate
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.guards import hold_step, recheck
from gpuhealth.controller.remediation.model import (
    Episode,
    OrderStatus,
    Phase,
    Status,
    replace_status,
)
from gpuhealth.controller.remediation.orders import (
    UNNUMBERED,
    absorb_report,
    current_order,
    new_order,
    resend_due,
    resent,
)
from gpuhealth.controller.remediation.status import enter, replace, wait
from gpuhealth.controller.remediation.step import Context, Step
from gpuhealth.protocol.remediation import Order, RebootOrder, ResetGpuOrder


def remediating(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    st, now = ep.status, obs.now
    started = st.times.remediating or now
    if not st.boot_id_before and node.boot_id:
        st = replace(st, boot_id_before=node.boot_id)
        ep = replace_status(ep, st)
    rebooted = bool(st.boot_id_before and node.boot_id) and node.boot_id != st.boot_id_before
    if rebooted and node.reporting == "ok":
        what = "rebooted" if ep.spec.action == "reboot" else "rebooted during the reset"
        message = f"node {what} (boot id {node.boot_id})"
        return Step(enter(st, Phase.VALIDATING, now, "Remediated", message, remediated=now))
    hold = hold_step(ep, node, obs, cx)
    if hold is not None:
        return hold
    if ep.spec.action == "reboot":
        return _reboot(ep, node, obs, cx, started)
    return _reset(ep, node, obs, cx, started)


def _send(
    st: Status, order: OrderStatus, outgoing: Order, now: datetime, due_in: float | None
) -> tuple[Status, tuple[Act, ...]]:
    if due_in != 0.0:
        return st, ()
    return replace(st, order=resent(order, now)), (SendOrder(outgoing),)


def _reset(ep: Episode, node: NodeFacts, obs: Observed, cx: Context, started: datetime) -> Step:
    st, now, rs = ep.status, obs.now, cx.settings.reset_gpu
    end = deadline(started, rs.timeout_s, now)
    order = absorb_report(current_order(st, "reset-gpu"), obs.report)
    if order is not None:
        st = replace(st, order=order)
        if order.state == "succeeded":
            return Step(
                enter(st, Phase.VALIDATING, now, "Remediated", "GPU reset done", remediated=now)
            )
    if now >= end:
        message = f"no successful reset after {rs.timeout_s:g}s"
        return escalate(st, now, "ResetTimeout", message, node=node.name, cx=cx)
    gpus = tuple(g.uuid for g in ep.spec.fault.gpus)
    attempt = order.attempt if order is not None else 0
    if order is not None and order.state in ("failed", "refused"):
        why = ": ".join(p for p in (order.reason, order.message) if p)
        if attempt >= rs.max_attempts:
            reason = "ResetFailed" if order.state == "failed" else "ResetRefused"
            return escalate(st, now, reason, f"attempt {attempt}: {why}", node=node.name, cx=cx)
        retry_at = deadline(order.reported_at, rs.retry_s, now)
        if now < retry_at:
            return Step(
                wait(st, now, "ResetRetryWait", f"attempt {attempt} {order.state}: {why}"),
                requeue_after_s=seconds_until(retry_at, now),
            )
        order = None
    if order is None:
        stale = recheck(ep, node, obs, cx)
        if stale is not None:
            return stale
        order = new_order(ep.spec.fault.fingerprint, "reset-gpu", attempt + 1, now)
        st = replace(st, order=order, attempts=order.attempt)
        due_in: float | None = 0.0
    else:
        due_in = resend_due(order, now, rs.order_timeout_s, cx.settings.undelivered_retry_s)
    outgoing = ResetGpuOrder(
        seq=UNNUMBERED,
        order_id=order.id,
        episode=ep.name,
        issued_at=now,
        deadline_s=rs.order_timeout_s,
        gpus=list(gpus),
    )
    st, acts = _send(st, order, outgoing, now, due_in)
    state = order.state or "sent"
    return Step(
        wait(st, now, "AwaitingReset", f"order {order.id} (attempt {order.attempt}): {state}"),
        actions=acts,
        requeue_after_s=earliest(
            due_in or None,
            cx.settings.undelivered_retry_s if acts else None,
            seconds_until(end, now),
        ),
    )


def _reboot(ep: Episode, node: NodeFacts, obs: Observed, cx: Context, started: datetime) -> Step:
    st, now, rb = ep.status, obs.now, cx.settings.reboot
    end = deadline(started, rb.timeout_s, now)
    if now >= end:
        message = f"boot id unchanged after {rb.timeout_s:g}s"
        return escalate(st, now, "RebootTimeout", message, node=node.name, cx=cx)
    until = seconds_until(end, now)
    if not st.boot_id_before:
        message = "the node's boot id is not known yet (agent not reporting)"
        return Step(wait(st, now, "AwaitingBootId", message), requeue_after_s=until)
    if rb.executor == "external":
        message = "waiting for an external reboot (this GPURemediation is the hand-off)"
        return Step(wait(st, now, "AwaitingExternalReboot", message), requeue_after_s=until)
    order = absorb_report(current_order(st, "reboot"), obs.report)
    if order is not None:
        st = replace(st, order=order)
        if order.state in ("failed", "refused") and order.reason != "boot-id-changed":
            reason = "RebootFailed" if order.state == "failed" else "RebootRefused"
            message = ": ".join(p for p in (order.reason, order.message) if p)
            return escalate(st, now, reason, message, node=node.name, cx=cx)
        due_in = resend_due(order, now, rb.order_timeout_s, cx.settings.undelivered_retry_s)
    else:
        stale = recheck(ep, node, obs, cx)
        if stale is not None:
            return stale
        order = new_order(ep.spec.fault.fingerprint, "reboot", 1, now)
        st = replace(st, order=order, attempts=1)
        due_in = 0.0
    outgoing = RebootOrder(
        seq=UNNUMBERED,
        order_id=order.id,
        episode=ep.name,
        issued_at=now,
        deadline_s=rb.order_timeout_s,
        expected_boot_id=st.boot_id_before,
        reason=f"gpuhealth remediation {ep.name}"[:1024],
    )
    st, acts = _send(st, order, outgoing, now, due_in)
    state = order.state or "sent"
    return Step(
        wait(st, now, "Rebooting", f"order {order.id}: {state}; waiting for a new boot id"),
        actions=acts,
        requeue_after_s=earliest(
            due_in or None, cx.settings.undelivered_retry_s if acts else None, until
        ),
    )
