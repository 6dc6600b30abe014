"""The NVML source's settings: the ``nvml:`` section."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings


class NvmlSettings(Settings, frozen=True, kw_only=True):
    poll_interval_s: PositiveSeconds = 1.0
    """Time between polls of every GPU (tools keep >= 1 s: NVML calls are not free)."""
    call_deadline_s: PositiveSeconds = 2.0
    """One GPU's whole sample read must finish within this; otherwise it is unresponsive."""
    init_deadline_s: PositiveSeconds = 60.0
    """nvmlInit and the inventory (slow without persistence mode)."""
    expected_gpus: Annotated[int, Meta(ge=0, le=64)] | None = None
    """GPUs the node should have; ``None``: as many as found at start."""
    event_wait_ms: Annotated[int, Meta(ge=1, le=60_000)] = 500
    """One nvmlEventSetWait; also how quickly the waiter notices shutdown."""
    nvlink_every_polls: PositiveInt = 5
    """NVLink state and error counters (about 90 calls per GPU) are read every Nth poll."""
    process_utilization: bool = True
    """Read per-process SM utilisation (for idle-allocation attribution)."""
    mig_recheck_s: PositiveSeconds = 60.0
    """A GPU whose MIG mode answered NOT_SUPPORTED is asked again this often (a mode change
    pending a reset may answer it); any change of mode re-probes every NOT_SUPPORTED call."""
    operational_events: bool = True
    """Subscribe to GPU Operational Events (drivers R615+, preview) where the driver offers
    them; older drivers keep the legacy paths (docs/operations.md)."""
    operational_events_recheck_s: PositiveSeconds = 300.0
    """A driver that did not offer operational events is asked again this often (a driver
    upgraded or reloaded under a running agent); also the longest pause before an event set
    whose waits keep failing is made anew."""
    cper_replay: bool = True
    """At start, read the GPUs' CPER records (nvmlSystemGetCPER_v1, root only) and report
    those not handled before (what happened while the agent was down)."""
    shutdown_deadline_s: PositiveSeconds = 2.0
    """At stop: how long the NVML threads may take to finish and nvmlShutdown to return (it
    runs in the NVML system thread, never on the event loop). Past it the agent stops anyway;
    keep it below the agent's ``shutdown_timeout_s``."""
