"""Drive a real :class:`controller.fleet.Fleet` through its IngestSink, as the stream would."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhealth.controller.fleet import Fleet
from gpuhealth.protocol import Condition, Event, GpuInfo, GpuStatus, Hello, Snapshot

MODEL = "NVIDIA H100 80GB HBM3"
XID79 = Condition(
    reason="XidError",
    code="xid-79",
    severity="unhealthy",
    message="GPU has fallen off the bus",
    action="RESTART_BM",
    xid=79,
)
HOT = Condition(
    reason="Thermal", code="thermal", severity="degraded", message="90 C", action="CHECK_COOLING"
)


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def connect(
    fleet: Fleet, node: str, gpus: int = 8, at: datetime | None = None, state: str = "healthy"
) -> None:
    infos = [GpuInfo(index=i, uuid=uuid(node, i), model=MODEL) for i in range(gpus)]
    fleet.on_connect(
        node, Hello(seq=1, node=node, stream_id="s", boot_id="b", agent_version="t", gpus=infos)
    )
    snap = Snapshot(
        seq=2,
        node=node,
        taken_at=at or datetime.now(UTC),
        gpus=[GpuStatus(info=g, state=state) for g in infos],  # type: ignore[arg-type]
    )
    fleet.on_message(node, snap)


def transition(
    fleet: Fleet, node: str, index: int, state: str, *conds: Condition, seq: int = 3
) -> None:
    fleet.on_message(
        node,
        Event(
            seq=seq,
            node=node,
            at=datetime.now(UTC),
            kind="transition",
            gpu_uuid=uuid(node, index),
            gpu_index=index,
            previous="healthy",
            current=state,  # type: ignore[arg-type]
            conditions=list(conds),
        ),
    )
