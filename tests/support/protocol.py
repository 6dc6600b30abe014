"""Protocol message builders: GPUs, Hello, Snapshot, transition Events, Heartbeats.

GPU UUIDs are ``GPU-<index>`` for a GPU built on its own and ``GPU-<node>-<index>`` for the
GPUs of a node (unique across a fleet, as real UUIDs are). Sequence numbers default to one
counter that only grows, so messages built one after the other are always in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    HealthState,
    Heartbeat,
    Hello,
    Snapshot,
)
from gpuhealth.protocol.v1 import CAPABILITIES

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
MODEL = "NVIDIA H100 80GB HBM3"

XID79 = Condition(
    reason="XidError",
    code="xid-79",
    severity="unhealthy",
    message="GPU has fallen off the bus",
    action="RESTART_BM",
    xid=79,
)
DBE = Condition(reason="EccUncorrectable", code="ecc-dbe", severity="unhealthy")
HOT = Condition(
    reason="Thermal", code="thermal", severity="degraded", message="90 C", action="CHECK_COOLING"
)

_seq = itertools.count(1000)


def fabric_fault(at: datetime) -> Condition:
    """The agent's NVLink fabric verdict (a fault of an NVLink domain's member), first seen
    ``at``."""
    return Condition(
        reason="FabricDegraded",
        code="fabric-degraded",
        severity="degraded",
        action="CONTACT_SUPPORT",
        message="NVLink fabric reports route-unhealthy",
        since=at,
    )


def next_seq() -> int:
    return next(_seq)


def gpu_uuid(index: int, node: str | None = None) -> str:
    return f"GPU-{index}" if node is None else f"GPU-{node}-{index}"


def gpu_info(index: int, node: str | None = None, *, model: str = MODEL) -> GpuInfo:
    return GpuInfo(index=index, uuid=gpu_uuid(index, node), model=model)


def gpu_status(
    index: int,
    state: HealthState = "healthy",
    *conditions: Condition,
    node: str | None = None,
    model: str = MODEL,
    telemetry: GpuTelemetry | None = None,
) -> GpuStatus:
    return GpuStatus(
        info=gpu_info(index, node, model=model),
        state=state,
        conditions=list(conditions),
        telemetry=telemetry,
    )


def hello(
    node: str,
    gpus: int | Sequence[GpuInfo] = 2,
    *,
    seq: int | None = None,
    stream_id: str = "s1",
    boot_id: str = "boot-1",
    agent_version: str = "test",
    expected_gpus: int | None = None,
    capabilities: Sequence[str] | None = CAPABILITIES,
) -> Hello:
    """``gpus``: how many (``GPU-<node>-<i>``) or the list; ``capabilities``: a current agent
    with remediation on can do everything (None: an agent older than the field)."""
    infos = [gpu_info(i, node) for i in range(gpus)] if isinstance(gpus, int) else list(gpus)
    return Hello(
        seq=seq if seq is not None else next_seq(),
        node=node,
        stream_id=stream_id,
        boot_id=boot_id,
        agent_version=agent_version,
        gpus=infos,
        expected_gpus=expected_gpus,
        capabilities=None if capabilities is None else list(capabilities),
    )


def snapshot(
    node: str,
    gpus: int | Sequence[GpuStatus] = 2,
    *,
    faults: Mapping[int, Condition] | None = None,
    state: HealthState = "healthy",
    seq: int | None = None,
    at: datetime = T0,
    allocations: Iterable[Allocation] = (),
) -> Snapshot:
    """``gpus``: how many, or the statuses. With a count every GPU is in ``state`` except
    those in ``faults`` (index -> the condition), which take their condition's severity."""
    if isinstance(gpus, int):
        faults = faults or {}
        statuses = [
            gpu_status(i, faults[i].severity, faults[i], node=node)
            if i in faults
            else gpu_status(i, state, node=node)
            for i in range(gpus)
        ]
    else:
        statuses = list(gpus)
    return Snapshot(
        seq=seq if seq is not None else next_seq(),
        node=node,
        taken_at=at,
        gpus=statuses,
        allocations=list(allocations),
    )


def transition(
    node: str,
    index: int,
    current: HealthState,
    *conditions: Condition,
    previous: HealthState | None = None,
    uuid: str | None = None,
    seq: int | None = None,
    at: datetime = T0,
) -> Event:
    """GPU ``index`` of ``node`` changed to ``current`` (from ``previous``: by default
    healthy, or unhealthy when ``current`` is healthy)."""
    if previous is None:
        previous = "unhealthy" if current == "healthy" else "healthy"
    return Event(
        seq=seq if seq is not None else next_seq(),
        node=node,
        at=at,
        kind="transition",
        gpu_uuid=uuid if uuid is not None else gpu_uuid(index, node),
        gpu_index=index,
        previous=previous,
        current=current,
        conditions=list(conditions),
    )


def fault(node: str, index: int, condition: Condition = XID79, **kw: object) -> Event:
    """GPU ``index`` of ``node`` became unhealthy for ``condition``."""
    return transition(node, index, condition.severity, condition, **kw)  # type: ignore[arg-type]


def recovery(node: str, index: int, **kw: object) -> Event:
    """GPU ``index`` of ``node`` is healthy again."""
    return transition(node, index, "healthy", **kw)  # type: ignore[arg-type]


def heartbeat(
    node: str,
    *,
    telemetry: Iterable[GpuTelemetry] = (),
    usage: Iterable[AllocationUsage] = (),
    seq: int | None = None,
    at: datetime = T0,
) -> Heartbeat:
    return Heartbeat(
        seq=seq if seq is not None else next_seq(),
        node=node,
        at=at,
        telemetry=list(telemetry),
        usage=list(usage),
    )


def allocation(
    gpu: str, pod: str = "p", *, namespace: str = "ns", container: str = "c", device_id: str = ""
) -> Allocation:
    """``gpu`` (a UUID) held by ``namespace/pod/container``; the device ID defaults to it."""
    return Allocation(
        namespace=namespace, pod=pod, container=container, gpu_uuid=gpu, device_id=device_id or gpu
    )
