"""Thresholds, windows and hysteresis of the health model (re-exported by agent.health)."""

from __future__ import annotations

import msgspec


class HealthSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every threshold, window and hysteresis setting of the health model.

    Threshold verdicts (temperature, throttling, SBE rate, NVLink, PCIe) are raised after
    ``raise_after_samples`` consecutive bad samples and cleared after ``clean_window_s`` without
    one, so a single noisy sample never flips a state. XID and ECC verdicts latch: they hold
    until a GPU reset, a reboot (a reset observation, or NVML's volatile counters going
    backwards) or an operator clear.
    """

    raise_after_samples: int = 3
    """Consecutive bad samples before a threshold verdict is raised."""
    clean_window_s: float = 300.0
    """A threshold verdict clears after this many seconds without a bad sample."""
    flag_confirm_samples: int = 2
    """Consecutive samples a device flag (row remap / page retirement pending, remap failure)
    must show before it counts, and consecutive clear samples before a pending flag clears."""

    slowdown_temperature_c: float = 90.0
    """Used when the GPU does not report its slowdown threshold."""
    shutdown_temperature_c: float = 95.0
    """Used when the GPU does not report its shutdown threshold."""
    temperature_margin_c: float = 0.0
    """Degraded at (slowdown threshold - margin); unhealthy at (shutdown threshold - margin)."""
    throttle_reasons: frozenset[str] = frozenset({"hw_thermal", "hw_slowdown"})
    """Throttle reasons that count as a thermal/hardware throttle."""
    throttle_sustain_s: float = 30.0
    """A throttle reason must stay active this long before the GPU is degraded."""

    sbe_rate_window_s: float = 3600.0
    sbe_rate_threshold: int = 100
    """Degraded when single-bit ECC errors grow by at least this much within the window."""
    nvlink_error_window_s: float = 300.0
    nvlink_error_threshold: int = 100
    """Degraded when NVLink replay+recovery+CRC errors grow by this much within the window."""
    pcie_replay_window_s: float = 300.0
    pcie_replay_threshold: int = 100
    """Degraded when the PCIe replay counter grows by this much within the window."""
    nvlink_down_degrades: bool = True
    """Degraded when fewer NVLinks are up than the GPU has."""

    app_xid_escalation_count: int = 10
    """This many application XIDs (13, 31, 43 ...) on one GPU within the window make it
    degraded (repeats on one GPU point at hardware). 0 disables."""
    app_xid_escalation_window_s: float = 600.0
    xid_dedup_window_s: float = 2.0
    """The same XID on the same GPU from a second source (NVML events and the kernel log
    both report it) within this window is counted once."""

    liveness_clear_s: float = 30.0
    """An unresponsive verdict clears once samples have flowed this long since the last
    timed-out call."""
    stale_after_s: float = 120.0
    """A GPU without a sample for this long is ``unknown`` (0 disables)."""
