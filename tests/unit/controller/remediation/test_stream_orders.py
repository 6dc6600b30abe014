"""The orders a step builds are the protocol's messages: the stream only numbers them and
stamps the time it sends them, and each is within every bound of the protocol."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from gpuhealth.controller.remediation.actions import SendOrder
from gpuhealth.controller.remediation.assembly import StreamOrders
from gpuhealth.controller.remediation.orders import ORDER_KINDS, UNNUMBERED
from gpuhealth.protocol.remediation import (
    CancelOrder,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
    decode_order,
    encode,
)
from tests.support.clock import FakeClock

BUILT = datetime(2026, 1, 1, tzinfo=UTC)
EPISODE = "node-a-0123456789abcdef"
ORDERS: list[Order] = [
    ResetGpuOrder(
        seq=UNNUMBERED,
        episode=EPISODE,
        issued_at=BUILT,
        order_id="0123456789abcdef-reset-gpu-1",
        deadline_s=60,
        gpus=["GPU-1"],
    ),
    RebootOrder(
        seq=UNNUMBERED,
        episode=EPISODE,
        issued_at=BUILT,
        order_id="0123456789abcdef-reboot-1",
        deadline_s=60,
        expected_boot_id="b",
        reason="r",
    ),
    ValidateOrder(
        seq=UNNUMBERED,
        episode=EPISODE,
        issued_at=BUILT,
        order_id="0123456789abcdef-validate-1",
        deadline_s=600,
        gpus=["GPU-1"],
        signals=["xid-48"],
        soak_s=30,
        diagnostic=True,
    ),
    CancelOrder(
        seq=UNNUMBERED,
        episode=EPISODE,
        issued_at=BUILT,
        order_id="0123456789abcdef-validate-1-cancel",
        cancel_order_id="0123456789abcdef-validate-1",
    ),
]


class Stream:
    """The agents' stream as ``StreamOrders`` sees it: numbers each order on the connection."""

    def __init__(self) -> None:
        self.sent: list[Order] = []

    async def send_order(self, node: str, make: Callable[[int], Order]) -> bool:
        self.sent.append(make(len(self.sent) + 1))
        return True


async def test_the_stream_numbers_and_stamps_each_order_and_changes_nothing_else() -> None:
    clock = FakeClock()
    stream = Stream()
    orders = StreamOrders(stream, clock)
    for order in ORDERS:
        assert await orders.send("node-a", order)
    for seq, (built, sent) in enumerate(zip(ORDERS, stream.sent, strict=True), start=1):
        assert type(sent) is type(built)
        assert (sent.seq, sent.issued_at) == (seq, clock.now())
        assert decode_order(encode(sent)) == sent  # within every bound of the protocol
        assert encode(
            sent.__class__(**{**_fields(sent), "seq": UNNUMBERED, "issued_at": BUILT})
        ) == (encode(built))


def _fields(order: Order) -> dict[str, object]:
    return {f: getattr(order, f) for f in order.__struct_fields__}


@pytest.mark.parametrize(
    ("order", "kind", "disruptive"),
    [
        (ORDERS[0], "reset-gpu", True),
        (ORDERS[1], "reboot", True),
        (ORDERS[2], "validate", False),
        (ORDERS[3], "cancel", False),
    ],
)
def test_every_order_kind_is_named_and_only_resets_and_reboots_are_hard_writes(
    order: Order, kind: str, disruptive: bool
) -> None:
    from gpuhealth.controller.remediation.actions import hard_write

    assert ORDER_KINDS[type(order)] == kind == SendOrder(order).kind
    assert (hard_write(SendOrder(order)) == kind) is disruptive
