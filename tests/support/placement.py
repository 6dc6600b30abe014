"""Placement builders: GPUs with the telemetry the extender scores, and allocations."""

from __future__ import annotations

from gpuhealth.protocol import Allocation, Condition, GpuStatus, GpuTelemetry, HealthState
from tests.support.protocol import (
    allocation,
    gpu_status,
    gpu_uuid,
)


def gpu(
    i: int,
    state: HealthState = "healthy",
    temp: float | None = None,
    sbe: int | None = None,
    bw: float | None = None,
    code: str = "xid-79",
) -> GpuStatus:
    """GPU ``i`` (``GPU-<i>``) with telemetry; an unhealthy one carries an XID condition."""
    tel = GpuTelemetry(
        uuid=gpu_uuid(i),
        temperature_c=temp,
        slowdown_temperature_c=None if temp is None else 90.0,
        sbe_recent=sbe,
        memory_bandwidth_ratio=bw,
    )
    conds = (
        [Condition(reason="XidError", code=code, severity="unhealthy")]
        if state == "unhealthy"
        else []
    )
    return gpu_status(i, state, *conds, telemetry=tel)


def alloc(i: int, pod_name: str = "p") -> Allocation:
    return allocation(gpu_uuid(i), pod_name)
