"""One GPU as the NVML source keeps it between polls (:class:`NvmlGpu`; :class:`GpuLost` when
NVML says it is lost). Its NVML calls run in its own thread
(:class:`~gpuhealth.agent.sources.call_thread.CallThread`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.agent.observations import GpuIdentity, GpuSample, MigDevice
from gpuhealth.agent.sources.call_thread import CallThread


@dataclass(slots=True)
class NvmlGpu:
    """One GPU as the NVML source keeps it between polls."""

    index: int
    handle: Any
    identity: GpuIdentity
    slowdown_c: float | None
    shutdown_c: float | None
    links: tuple[int, ...]
    unsupported: set[str] = field(default_factory=set)
    """Calls that answered NOT_SUPPORTED: not asked again."""
    thread: CallThread | None = None
    pending: Future[GpuSample] | None = None
    """A sample read that passed its deadline and has not returned yet."""
    unhealthy: bool = False
    nvlink_cache: tuple[int | None, int | None, int | None] = (None, None, None)
    process_ts: int = 0
    reset_required: bool = False
    """A call of the current read answered NVML_ERROR_RESET_REQUIRED."""
    mig_on: bool | None = None
    """MIG mode at the last poll (a change re-probes every NOT_SUPPORTED call)."""
    mig_checked: float = 0.0
    """When MIG mode was last asked although it had answered NOT_SUPPORTED (monotonic)."""
    mig_slots: dict[int, tuple[Any, MigDevice]] = field(default_factory=dict)
    """MIG slot -> (handle key, the instance's static identity)."""


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST."""
