"""From an :class:`~gpuhealth.controller.remediation.actions.OrderRequest` to the order
message on the agent stream (the stream adds ``seq``, counted per connection)."""

from __future__ import annotations

from datetime import datetime

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
