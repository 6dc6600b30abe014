"""From an :class:`~gpuhealth.controller.remediation.actions.OrderRequest` to the order
message on the agent stream (the stream adds ``seq``, counted per connection)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.controller.remediation.actions import OrderRequest
from gpuhealth.protocol.remediation import (
    CancelOrder,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)


def order_message(req: OrderRequest, *, seq: int, episode: str, now: datetime) -> Order:
    common = {"seq": seq, "order_id": req.order_id, "episode": episode, "issued_at": now}
    if req.kind == "reset-gpu":
        return ResetGpuOrder(**common, deadline_s=req.deadline_s, gpus=list(req.gpus))  # type: ignore[arg-type]
    if req.kind == "reboot":
        return RebootOrder(
            **common,  # type: ignore[arg-type]
            deadline_s=req.deadline_s,
            expected_boot_id=req.expected_boot_id,
            reason=req.reason[:1024],
        )
    if req.kind == "validate":
        return ValidateOrder(
            **common,  # type: ignore[arg-type]
            deadline_s=req.deadline_s,
            gpus=list(req.gpus),
            signals=list(req.signals),
            soak_s=req.soak_s,
            diagnostic=req.diagnostic,
        )
    return CancelOrder(**common, cancel_order_id=req.cancel_order_id)  # type: ignore[arg-type]


class OrderStream(Protocol):
    """The agents' stream (:class:`controller.stream.server.StreamServer`)."""

    async def send_order(self, node: str, make: Callable[[int], Order]) -> bool: ...


class StreamOrders:
    """The runner's ``OrderSender`` over the agents' stream: the order goes to the node's live
    connection on this replica (agents talk to the leader), ``seq`` counted there."""

    def __init__(self, stream: OrderStream, clock: Clock) -> None:
        self._stream = stream
        self._clock = clock

    async def send(self, node: str, episode: str, request: OrderRequest) -> bool:
        now = self._clock.now()
        return await self._stream.send_order(
            node, lambda seq: order_message(request, seq=seq, episode=episode, now=now)
        )
