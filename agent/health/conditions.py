"""Health conditions: every verdict's reason, severity and action, and how they are built.

Codes are label values (taint values on the controller side): ``xid-79``, ``ecc-dbe``,
``gpu-lost`` ... Reasons are CamelCase.
"""

from __future__ import annotations

from datetime import datetime

from gpuhealth.agent.health.xid_catalog import XidVerdict
from gpuhealth.agent.observations import GpuIdentity
from gpuhealth.protocol import Condition, GpuInfo, HealthState

SEVERITY_RANK: dict[str, int] = {"healthy": 0, "unknown": 1, "degraded": 2, "unhealthy": 3}


def condition_sort_key(c: Condition) -> tuple[int, float, str]:
    """Worst first; among equals the oldest (the first fault seen is the root cause: XID 79
    comes before the GPU-lost it leads to), so a later condition never changes the primary."""
    since = c.since.timestamp() if c.since is not None else float("inf")
    return (-SEVERITY_RANK.get(c.severity, 0), since, c.code)


RULES: dict[str, tuple[str, HealthState, str]] = {
    "ecc-dbe": ("EccUncorrectable", "unhealthy", "RESET_GPU"),
    "ecc-sbe-rate": ("EccSbeRate", "degraded", "RUN_DIAGNOSTICS"),
    "gpu-lost": ("GpuLost", "unhealthy", "RESTART_BM"),
    "gpu-missing": ("GpuMissing", "unhealthy", "RESTART_BM"),
    "gpu-unresponsive": ("GpuUnresponsive", "unhealthy", "RESET_GPU"),
    "nvlink-down": ("NvlinkDown", "degraded", "RESET_GPU"),
    "nvlink-errors": ("NvlinkErrors", "degraded", "RUN_DIAGNOSTICS"),
    "pcie-replays": ("PcieReplays", "degraded", "RUN_DIAGNOSTICS"),
    "retired-pages-pending": ("RetiredPagesPending", "degraded", "RESET_GPU"),
    "row-remap-failure": ("RowRemapFailure", "unhealthy", "CONTACT_SUPPORT"),
    "row-remap-pending": ("RowRemapPending", "degraded", "RESET_GPU"),
    "thermal": ("ThermalSlowdown", "degraded", "CHECK_COOLING"),
    "thermal-shutdown": ("ThermalShutdown", "unhealthy", "CHECK_COOLING"),
    "thermal-throttle": ("ThermalThrottle", "degraded", "CHECK_COOLING"),
    "xid-repeated": ("XidRepeated", "degraded", "RUN_DIAGNOSTICS"),
}
"""Condition code -> (reason, severity, action) for every non-XID verdict."""


def build_condition(code: str, message: str, at: datetime, *, xid: int | None = None) -> Condition:
    reason, severity, action = RULES[code]
    return Condition(
        reason=reason,
        code=code,
        severity=severity,
        action=action,
        message=message[:1024],
        xid=xid,
        since=at,
    )


def xid_message(name: str, detail: str) -> str:
    """The catalog name, plus the driver's text when it says more than the name does."""
    d = detail.strip()
    if not d:
        return name
    if d.lower().startswith(name.rstrip(".").lower()):
        return d
    return f"{name}: {d}"


def xid_condition(v: XidVerdict, message: str, at: datetime) -> Condition:
    return Condition(
        reason=v.reason,
        code=v.code[:63],
        severity=v.severity,
        action=v.action,
        message=message[:1024],
        xid=v.xid,
        since=at,
    )


def make_condition(code: str, message: str, at: datetime) -> Condition:
    """A non-XID condition by code (see :data:`RULES`)."""
    return build_condition(code, message, at)


def gpu_info(g: GpuIdentity) -> GpuInfo:
    return GpuInfo(
        index=min(max(g.index, 0), 1023),
        uuid=g.uuid or "unknown",
        pci_bus_id=g.pci_bus_id[:128],
        model=g.model[:128],
        serial=None if g.serial is None else g.serial[:128],
        memory_total_bytes=g.memory_total_bytes,
        mig_enabled=g.mig_enabled,
    )
