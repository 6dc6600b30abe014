"""Thresholds, windows and hysteresis of the health model: the ``health:`` section."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from gpuhealth.common.config import (
    Count,
    PositiveInt,
    PositiveSeconds,
    Seconds,
    SettingError,
    Settings,
)

Window = PositiveSeconds
Celsius = Annotated[float, Meta(ge=-50.0, le=200.0)]
XidCode = Annotated[int, Meta(ge=1, le=1_000_000)]
ThrottleReason = Literal[
    "hw_thermal", "sw_thermal", "hw_slowdown", "power_cap",
    "hw_power_brake", "sync_boost", "idle", "applications_clocks",
]  # fmt: skip
"""NVML's clocks-event (throttle) reasons, as the sources name them."""


class HealthSettings(Settings, frozen=True, kw_only=True):
    """Every threshold, window and hysteresis setting of the health model.

    Threshold verdicts (temperature, throttling, SBE rate, NVLink, PCIe) are raised after
    ``raise_after_samples`` consecutive bad samples and cleared after ``clean_window_s`` without
    one, so a single noisy sample never flips a state. XID and ECC verdicts latch: they hold
    until a GPU reset, a reboot (a reset observation, or NVML's volatile counters going
    backwards) or an operator clear.
    """

    raise_after_samples: PositiveInt = 3
    """Consecutive bad samples before a threshold verdict is raised."""
    clean_window_s: Seconds = 300.0
    """A threshold verdict clears after this many seconds without a bad sample."""
    flag_confirm_samples: PositiveInt = 2
    """Consecutive samples a device flag (row remap / page retirement pending, remap failure)
    must show before it counts, and consecutive clear samples before a pending flag clears."""

    slowdown_temperature_c: Celsius = 90.0
    """Used when the GPU does not report its slowdown threshold."""
    shutdown_temperature_c: Celsius = 95.0
    """Used when the GPU does not report its shutdown threshold."""
    temperature_margin_c: Annotated[float, Meta(ge=0.0, le=50.0)] = 0.0
    """Degraded at (slowdown threshold - margin); unhealthy at (shutdown threshold - margin)."""
    throttle_reasons: frozenset[ThrottleReason] = frozenset({"hw_thermal", "hw_slowdown"})
    """Throttle reasons that count as a thermal/hardware throttle."""
    throttle_sustain_s: Seconds = 30.0
    """A throttle reason must stay active this long before the GPU is degraded."""

    sbe_rate_window_s: Window = 3600.0
    """The sliding window ``sbe_rate_threshold`` counts single-bit ECC errors in."""
    sbe_rate_threshold: PositiveInt = 100
    """Degraded when single-bit ECC errors grow by at least this much within the window."""
    nvlink_error_window_s: Window = 300.0
    """The sliding window ``nvlink_error_threshold`` counts NVLink errors in."""
    nvlink_error_threshold: PositiveInt = 100
    """Degraded when NVLink replay+recovery+CRC errors grow by this much within the window."""
    pcie_replay_window_s: Window = 300.0
    """The sliding window ``pcie_replay_threshold`` counts PCIe replays in."""
    pcie_replay_threshold: PositiveInt = 100
    """Degraded when the PCIe replay counter grows by this much within the window."""
    nvlink_down_degrades: bool = True
    """Degraded when fewer NVLinks are up than the GPU has."""
    fabric_not_ready_s: Window = 300.0
    """A multi-node NVLink GPU (GB200/GB300 NVL72) whose fabric registration has not
    completed (or failed) for this long is unhealthy (``fabric-not-ready``): registration takes
    a while after boot or a GPU reset. Off those systems NVML reports no fabric: never raised."""

    app_xid_escalation_codes: frozenset[XidCode] = frozenset({13, 31})
    """Application XIDs whose repeats on one GPU point at hardware (NVIDIA's XID 13 / 31
    workflows). 43 and 45 (an application aborted or was cancelled) never escalate."""
    app_xid_escalation_count: Count = 5
    """This many bursts of those XIDs on one GPU within the window make it degraded.
    0 disables."""
    app_xid_escalation_window_s: Window = 3600.0
    """The sliding window ``app_xid_escalation_count`` counts bursts in."""
    app_xid_burst_s: Seconds = 10.0
    """XIDs closer together than this are one burst: one crash can log dozens of XID 13
    lines (one per SM), and one crash must never escalate."""
    xid_dedup_window_s: Seconds = 2.0
    """The same XID on the same GPU from a second source (NVML events and the kernel log
    both report it) within this window is counted once."""
    operational_event_window_s: Seconds = 10.0
    """A GPU Operational Event and an observation of its legacy Xid (kernel log, NVML Xid event,
    dcgm-exporter) on the same GPU within this window are one occurrence: counted and judged
    once, with the structured record's scope and attributes, in whichever order they arrive
    (the kernel log can lag the NVML event by seconds under load)."""

    unmapped_xid_hold_s: PositiveSeconds = 300.0
    """An XID known only by its PCI address (the kernel log) that arrives before the first
    GPU inventory (the ring buffer's replay at start; NVML's first inventory can take minutes
    without persistence mode) waits this long for it; then it is dropped as unmapped."""
    unmapped_xid_hold_max: PositiveInt = 1000
    """The most such XIDs waiting for the first inventory; beyond, the oldest is dropped as
    unmapped."""

    liveness_clear_s: Seconds = 30.0
    """An unresponsive verdict clears once samples have flowed this long since the last
    timed-out call."""
    stale_after_s: Seconds = 120.0
    """A GPU without a sample for this long is ``unknown`` (0 disables)."""

    def check(self) -> None:
        if self.slowdown_temperature_c > self.shutdown_temperature_c:
            raise SettingError("slowdown_temperature_c", "must not be above shutdown_temperature_c")
        if self.app_xid_burst_s >= self.app_xid_escalation_window_s:
            raise SettingError(
                "app_xid_burst_s", "must be shorter than app_xid_escalation_window_s"
            )
