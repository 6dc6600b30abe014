"""The health rules other than the XID catalog, as data: one row per verdict.

:data:`VERDICTS` names every non-XID verdict once: its condition code (a label value, the taint
value on the controller side), reason, severity and action, whether it latches (holds until a
GPU reset, a reboot or an operator clear) and whether a GPU reset clears it.
:data:`SAMPLE_RULES` says how the verdicts that come from samples are evaluated: what a sample
must show to count as bad, with which hysteresis, and the message. The tracker of one GPU
(:mod:`gpuhealth.agent.health.gpu_tracker`) runs every row the same way. The XIDs' meanings are
the same kind of table, in ``xid_catalog.yaml``.

A change of threshold is a setting (:mod:`gpuhealth.agent.health.settings`); a new verdict
is a row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpuhealth.agent.health import fabric
from gpuhealth.agent.health import recovery_action as recovery
from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.observations import GpuSample

Severity = Literal["degraded", "unhealthy"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one condition code means."""

    code: str
    reason: str
    severity: Severity
    action: str
    latched: bool = False
    """Holds until a GPU reset, a reboot or an operator clear (saved across agent restarts)."""
    cleared_by_reset: bool = False
    """A GPU reset clears it even though it does not latch (pending flags take effect then)."""


ECC_DBE = Verdict("ecc-dbe", "EccUncorrectable", "unhealthy", "RESET_GPU", latched=True)
ECC_SBE_RATE = Verdict("ecc-sbe-rate", "EccSbeRate", "degraded", "RUN_DIAGNOSTICS")
GPU_LOST = Verdict("gpu-lost", "GpuLost", "unhealthy", "RESTART_BM", latched=True)
GPU_MISSING = Verdict("gpu-missing", "GpuMissing", "unhealthy", "RESTART_BM", latched=True)
GPU_UNRESPONSIVE = Verdict(
    "gpu-unresponsive", "GpuUnresponsive", "unhealthy", "RESET_GPU", cleared_by_reset=True
)
NVLINK_DOWN = Verdict("nvlink-down", "NvlinkDown", "degraded", "RESET_GPU")
NVLINK_ERRORS = Verdict("nvlink-errors", "NvlinkErrors", "degraded", "RUN_DIAGNOSTICS")
PCIE_REPLAYS = Verdict("pcie-replays", "PcieReplays", "degraded", "RUN_DIAGNOSTICS")
RETIRED_PAGES_PENDING = Verdict(
    "retired-pages-pending", "RetiredPagesPending", "degraded", "RESET_GPU", cleared_by_reset=True
)
ROW_REMAP_FAILURE = Verdict(
    "row-remap-failure", "RowRemapFailure", "unhealthy", "CONTACT_SUPPORT", latched=True
)
ROW_REMAP_PENDING = Verdict(
    "row-remap-pending", "RowRemapPending", "degraded", "RESET_GPU", cleared_by_reset=True
)
THERMAL = Verdict("thermal", "ThermalSlowdown", "degraded", "CHECK_COOLING")
THERMAL_SHUTDOWN = Verdict("thermal-shutdown", "ThermalShutdown", "unhealthy", "CHECK_COOLING")
THERMAL_THROTTLE = Verdict("thermal-throttle", "ThermalThrottle", "degraded", "CHECK_COOLING")
XID_REPEATED = Verdict(
    "xid-repeated", "XidRepeated", "degraded", "RUN_DIAGNOSTICS", cleared_by_reset=True
)
RESET_REQUIRED = Verdict(
    "reset-required", "ResetRequired", "unhealthy", "RESET_GPU", cleared_by_reset=True
)
FABRIC_NOT_READY = Verdict("fabric-not-ready", "FabricNotReady", "unhealthy", "CONTACT_SUPPORT")
"""A multi-node NVLink GPU not registered with its fabric: a GPU reset does not mend a fabric
shared by the rack (the controller names the domain to the operator)."""
FABRIC_DEGRADED = Verdict("fabric-degraded", "FabricDegraded", "degraded", "CONTACT_SUPPORT")
SXID_FATAL = Verdict("nvswitch-fatal", "NvswitchFatal", "unhealthy", "RESTART_BM", latched=True)
"""A fatal NVSwitch error (``SXid``, kernel log): a node condition, not a GPU's."""
RAIL_DOWN = Verdict("rail-down", "RailDown", "degraded", "CHECK_NETWORK")
"""The rail verdicts: a fault of an InfiniBand or RoCE port, raised on every GPU behind it
(:mod:`gpuhealth.agent.health.rails`). Their severity is the operator's (``rdma.rails``):
this row's is the default. ``CHECK_NETWORK`` maps to no remediation action (no GPU reset or
reboot mends a cable or a switch port)."""
RAIL_FLAPPING = Verdict("rail-flapping", "RailFlapping", "degraded", "CHECK_NETWORK")
RAIL_DEGRADED_RATE = Verdict("rail-degraded-rate", "RailDegradedRate", "degraded", "CHECK_NETWORK")
RAIL_ERRORS = Verdict("rail-errors", "RailErrors", "degraded", "CHECK_NETWORK")
RAIL_VERDICTS = (RAIL_DOWN, RAIL_FLAPPING, RAIL_DEGRADED_RATE, RAIL_ERRORS)


def _recovery(row: recovery.RecoveryAction) -> Verdict:
    sev: Severity = "unhealthy" if row.severity == "unhealthy" else "degraded"
    return Verdict(
        row.code, "GpuRecoveryAction", sev, row.action, cleared_by_reset=row.action == "RESET_GPU"
    )


RECOVERY: dict[int, Verdict] = {
    row.value: _recovery(row)
    for row in (*recovery.RECOVERY_ACTIONS, recovery.UNKNOWN)
    if row is not recovery.NONE
}
"""NVML recovery-action value -> its verdict (``-1``: a value the table does not know)."""


def recovery_verdict(value: int) -> Verdict | None:
    """The verdict for a recovery-action value; ``None`` for 0 (no action needed)."""
    if value == recovery.NONE.value:
        return None
    return RECOVERY.get(value) or RECOVERY[recovery.UNKNOWN.value]


VERDICTS: dict[str, Verdict] = {
    v.code: v
    for v in (
        ECC_DBE, ECC_SBE_RATE, GPU_LOST, GPU_MISSING, GPU_UNRESPONSIVE, NVLINK_DOWN,
        NVLINK_ERRORS, PCIE_REPLAYS, RETIRED_PAGES_PENDING, ROW_REMAP_FAILURE, ROW_REMAP_PENDING,
        THERMAL, THERMAL_SHUTDOWN, THERMAL_THROTTLE, XID_REPEATED, RESET_REQUIRED,
        FABRIC_NOT_READY, FABRIC_DEGRADED, SXID_FATAL, *RECOVERY.values(), *RAIL_VERDICTS,
    )
}  # fmt: skip
"""Condition code -> verdict, for every verdict that is not an XID."""


Judge = Callable[[GpuSample, HealthSettings, int], bool | None]
"""``(sample, settings, growth) -> bad``, or None when the GPU does not report it. ``growth``:
for a counter rule, how much the counter grew within the rule's window (else 0)."""
Describe = Callable[[GpuSample, HealthSettings, int], str]
"""The condition's message, built only when the verdict is raised."""


@dataclass(frozen=True, slots=True)
class SampleRule:
    """A verdict raised and cleared from samples.

    ``hysteresis="samples"``: raised after ``raise_after_samples`` consecutive bad samples
    (spanning ``sustain_s``), cleared after ``clean_window_s`` without one. ``"flag"`` (a device
    flag): raised and cleared after ``flag_confirm_samples`` consecutive samples either way; a
    GPU reset starts the count over.
    """

    verdict: Verdict
    judge: Judge
    describe: Describe
    hysteresis: Literal["samples", "flag"] = "samples"
    sustain_s: Callable[[HealthSettings], float] | None = None
    counter: Callable[[GpuSample], int | None] | None = None
    """For a counter rule: the cumulative counter whose growth ``judge`` sees."""
    window_s: Callable[[HealthSettings], float] | None = None
    """For a counter rule: the window the growth is counted in."""
    restarts_with_gpu: bool = False
    """The counter restarts at a GPU reset (its window starts over then)."""
    gate: Callable[[GpuSample], bool] | None = None
    """For a group of rules over a field that is nearly always clear: the group runs only
    when ``gate(sample)`` is true or one of its trackers holds state (a bad streak, a raised
    verdict), so a clean sample costs one call for the whole group."""


def _slowdown(smp: GpuSample, s: HealthSettings) -> float:
    return (smp.slowdown_temperature_c or s.slowdown_temperature_c) - s.temperature_margin_c


def _shutdown(smp: GpuSample, s: HealthSettings) -> float:
    return (smp.shutdown_temperature_c or s.shutdown_temperature_c) - s.temperature_margin_c


def _hot(smp: GpuSample, s: HealthSettings, _: int) -> bool | None:
    temp = smp.temperature_c
    return None if temp is None else temp >= _slowdown(smp, s)


def _hot_message(smp: GpuSample, s: HealthSettings, _: int) -> str:
    return f"temperature {smp.temperature_c:.0f} C at or above slowdown {_slowdown(smp, s):.0f} C"


def _too_hot(smp: GpuSample, s: HealthSettings, _: int) -> bool | None:
    temp = smp.temperature_c
    return None if temp is None else temp >= _shutdown(smp, s)


def _too_hot_message(smp: GpuSample, s: HealthSettings, _: int) -> str:
    return f"temperature {smp.temperature_c:.0f} C at or above shutdown {_shutdown(smp, s):.0f} C"


def _throttled(smp: GpuSample, s: HealthSettings, _: int) -> bool | None:
    reasons = smp.throttle_reasons
    return None if reasons is None else not reasons.isdisjoint(s.throttle_reasons)


def _throttled_message(smp: GpuSample, s: HealthSettings, _: int) -> str:
    hit = (smp.throttle_reasons or frozenset()) & s.throttle_reasons
    return "sustained throttling: " + ",".join(sorted(hit))


def _sbe(smp: GpuSample) -> int | None:
    return smp.ecc_sbe_volatile if smp.ecc_sbe_volatile is not None else smp.ecc_sbe_aggregate


def _sbe_window(s: HealthSettings) -> float:
    return s.sbe_rate_window_s


def _pcie_window(s: HealthSettings) -> float:
    return s.pcie_replay_window_s


def _nvlink_window(s: HealthSettings) -> float:
    return s.nvlink_error_window_s


def _grew(threshold: Callable[[HealthSettings], int]) -> Judge:
    def judge(_: GpuSample, s: HealthSettings, growth: int) -> bool:
        return growth >= threshold(s)

    return judge


def _growth_message(what: str, window: Callable[[HealthSettings], float]) -> Describe:
    def describe(_: GpuSample, s: HealthSettings, growth: int) -> str:
        return f"{growth} {what} within {window(s):.0f} s"

    return describe


def _links_down(smp: GpuSample, s: HealthSettings, _: int) -> bool | None:
    up, total = smp.nvlink_links_up, smp.nvlink_links_total
    if not s.nvlink_down_degrades or up is None or not total:
        return None
    return up < total


def _links_down_message(smp: GpuSample, _: HealthSettings, __: int) -> str:
    up, total = smp.nvlink_links_up or 0, smp.nvlink_links_total or 0
    return f"{total - up} of {total} NVLinks down"


def _flag(read: Callable[[GpuSample], bool | None]) -> Judge:
    def judge(smp: GpuSample, _: HealthSettings, __: int) -> bool | None:
        return read(smp)

    return judge


def _says(message: str) -> Describe:
    def describe(_: GpuSample, __: HealthSettings, ___: int) -> str:
        return message

    return describe


def _recovery_is(value: int) -> Judge:
    known = frozenset(RECOVERY) - {recovery.UNKNOWN.value}

    def judge(smp: GpuSample, _: HealthSettings, __: int) -> bool | None:
        v = smp.recovery_action
        if v is None:
            return None
        if value == recovery.UNKNOWN.value:
            return v != recovery.NONE.value and v not in known
        return v == value

    return judge


def _recovery_gate(smp: GpuSample) -> bool:
    """The driver asks for something (a recovery action, or a call said RESET_REQUIRED)."""
    return bool(smp.recovery_action) or bool(smp.reset_required)


def _recovery_message(smp: GpuSample, _: HealthSettings, __: int) -> str:
    v = smp.recovery_action or 0
    return f"the driver asks for: {recovery.from_value(v).label} (GPU recovery action 0x{v:x})"


SAMPLE_RULES: tuple[SampleRule, ...] = (
    SampleRule(THERMAL, _hot, _hot_message),
    SampleRule(THERMAL_SHUTDOWN, _too_hot, _too_hot_message),
    SampleRule(
        THERMAL_THROTTLE,
        _throttled,
        _throttled_message,
        sustain_s=lambda s: s.throttle_sustain_s,
    ),
    SampleRule(
        ECC_SBE_RATE,
        _grew(lambda s: s.sbe_rate_threshold),
        _growth_message("single-bit ECC errors", _sbe_window),
        counter=_sbe,
        window_s=_sbe_window,
        restarts_with_gpu=True,
    ),
    SampleRule(
        ROW_REMAP_PENDING,
        _flag(lambda smp: smp.row_remap_pending),
        _says("row remapping pending; takes effect at the next GPU reset"),
        hysteresis="flag",
    ),
    SampleRule(
        RETIRED_PAGES_PENDING,
        _flag(lambda smp: smp.retired_pages_pending),
        _says("page retirement pending until the next GPU reset"),
        hysteresis="flag",
    ),
    SampleRule(
        ROW_REMAP_FAILURE,
        _flag(lambda smp: smp.row_remap_failure),
        _says("row remapping failed: the GPU needs replacing"),
        hysteresis="flag",
    ),
    SampleRule(
        PCIE_REPLAYS,
        _grew(lambda s: s.pcie_replay_threshold),
        _growth_message("PCIe replays", _pcie_window),
        counter=lambda smp: smp.pcie_replay_count,
        window_s=_pcie_window,
    ),
    SampleRule(
        NVLINK_ERRORS,
        _grew(lambda s: s.nvlink_error_threshold),
        _growth_message("NVLink errors", _nvlink_window),
        counter=lambda smp: smp.nvlink_errors,
        window_s=_nvlink_window,
    ),
    SampleRule(NVLINK_DOWN, _links_down, _links_down_message),
    SampleRule(
        RESET_REQUIRED,
        _flag(lambda smp: smp.reset_required),
        _says("NVML answers NVML_ERROR_RESET_REQUIRED: the GPU needs a reset"),
        hysteresis="flag",
        gate=_recovery_gate,
    ),
    SampleRule(
        FABRIC_NOT_READY,
        fabric.not_ready,
        fabric.not_ready_message,
        sustain_s=lambda s: s.fabric_not_ready_s,
        gate=fabric.fabric_gate,
    ),
    SampleRule(
        FABRIC_DEGRADED,
        fabric.degraded,
        fabric.degraded_message,
        hysteresis="flag",
        gate=fabric.fabric_gate,
    ),
    *(
        SampleRule(
            verdict, _recovery_is(value), _recovery_message, hysteresis="flag", gate=_recovery_gate
        )
        for value, verdict in RECOVERY.items()
    ),
)
"""Every verdict that comes from samples, in the order they are evaluated."""
