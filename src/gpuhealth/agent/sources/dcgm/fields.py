"""The DCGM fields the dcgm-exporter source reads, and which health rule each one feeds.

A table, no I/O. :data:`FIELDS` says how each ``DCGM_FI_*`` series becomes a
:class:`~gpuhealth.agent.observations.GpuSample` field and whether DCGM reports it for the
whole GPU (``device``) or per MIG GPU instance (``instance``: framebuffer, profiling).
:data:`RULE_FIELDS` says which fields each health rule needs (any one of the alternatives
will do); a rule none of whose fields the exporter serves is *blind*: it can never fire.
The names are dcgm-exporter's metric names, which are the DCGM field names of its counters
CSV (the long-standing names, which every dcgm-exporter release accepts; the chart's
``files/dcgm-exporter/gpuhealth-counters.csv`` lists them all).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from gpuhealth.agent.health.rules import (
    ECC_DBE,
    ECC_SBE_RATE,
    FABRIC_DEGRADED,
    FABRIC_NOT_READY,
    GPU_LOST,
    GPU_MISSING,
    GPU_UNRESPONSIVE,
    NVLINK_DOWN,
    NVLINK_ERRORS,
    PCIE_REPLAYS,
    RAIL_VERDICTS,
    RECOVERY,
    RESET_REQUIRED,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    SXID_FATAL,
    THERMAL,
    THERMAL_SHUTDOWN,
    THERMAL_THROTTLE,
    XID_REPEATED,
)

Convert = Literal["float", "int", "bool", "percent", "mhz", "mib", "ratio"]
Scope = Literal["device", "instance"]

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
NVLINK_ERROR_FIELDS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
THROTTLE_FIELDS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    attr: str
    """The GpuSample attribute (or a pseudo-attribute the source combines: nvlink, fb)."""
    convert: Convert = "float"
    scope: Scope = "device"


FIELDS: dict[str, FieldSpec] = {
    "DCGM_FI_DEV_GPU_TEMP": FieldSpec("temperature_c"),
    "DCGM_FI_DEV_MEMORY_TEMP": FieldSpec("memory_temperature_c"),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": FieldSpec("slowdown_temperature_c"),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": FieldSpec("shutdown_temperature_c"),
    "DCGM_FI_DEV_POWER_USAGE": FieldSpec("power_w"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": FieldSpec("power_limit_w"),
    GPU_UTIL: FieldSpec("utilization_ratio", "percent"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": FieldSpec("memory_utilization_ratio", "percent"),
    "DCGM_FI_DEV_SM_CLOCK": FieldSpec("sm_clock_hz", "mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": FieldSpec("memory_clock_hz", "mhz"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": FieldSpec("ecc_sbe_volatile", "int"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": FieldSpec("ecc_dbe_volatile", "int"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": FieldSpec("ecc_sbe_aggregate", "int"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": FieldSpec("ecc_dbe_aggregate", "int"),
    "DCGM_FI_DEV_RETIRED_SBE": FieldSpec("retired_pages_sbe", "int"),
    "DCGM_FI_DEV_RETIRED_DBE": FieldSpec("retired_pages_dbe", "int"),
    "DCGM_FI_DEV_RETIRED_PENDING": FieldSpec("retired_pages_pending", "bool"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FieldSpec("remapped_rows_correctable", "int"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FieldSpec("remapped_rows_uncorrectable", "int"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": FieldSpec("row_remap_pending", "bool"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FieldSpec("row_remap_failure", "bool"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FieldSpec("pcie_replay_count", "int"),
    "DCGM_FI_DEV_FAN_SPEED": FieldSpec("fan_speed_ratio", "percent"),
    "DCGM_FI_DEV_PSTATE": FieldSpec("performance_state", "int"),
    **{name: FieldSpec("nvlink_errors", "int") for name in NVLINK_ERROR_FIELDS},
    **{name: FieldSpec("throttle_reasons", "int") for name in THROTTLE_FIELDS},
    XID_FIELD: FieldSpec("xid", "int"),
    FB_USED: FieldSpec("memory_used_bytes", "mib", "instance"),
    FB_FREE: FieldSpec("memory_free_bytes", "mib", "instance"),
    GR_ENGINE_ACTIVE: FieldSpec("engine_active_ratio", "ratio", "instance"),
}
"""Every DCGM field the source reads -> how (the counters CSV must serve all of them)."""

RULE_FIELDS: dict[str, tuple[str, ...]] = {
    THERMAL.code: ("DCGM_FI_DEV_GPU_TEMP",),
    THERMAL_SHUTDOWN.code: ("DCGM_FI_DEV_GPU_TEMP",),
    THERMAL_THROTTLE.code: THROTTLE_FIELDS,
    ECC_SBE_RATE.code: ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    ECC_DBE.code: ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    ROW_REMAP_PENDING.code: ("DCGM_FI_DEV_ROW_REMAP_PENDING",),
    ROW_REMAP_FAILURE.code: ("DCGM_FI_DEV_ROW_REMAP_FAILURE",),
    RETIRED_PAGES_PENDING.code: ("DCGM_FI_DEV_RETIRED_PENDING",),
    PCIE_REPLAYS.code: ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
    NVLINK_ERRORS.code: NVLINK_ERROR_FIELDS,
    "xid": (XID_FIELD,),
    "idle": (GPU_UTIL, GR_ENGINE_ACTIVE),
}
"""Health rule (condition code; ``xid`` for every XID verdict, ``idle`` for idle-GPU
detection) -> the fields that feed it, any one of which is enough."""

NOT_FROM_DCGM: dict[str, str] = {
    NVLINK_DOWN.code: "DCGM has no NVLink link-state field that dcgm-exporter serves per GPU",
    GPU_LOST.code: "a lost GPU is NVML's GPU_IS_LOST; dcgm-exporter just stops serving it",
    GPU_UNRESPONSIVE.code: "call deadlines are NVML's",
    GPU_MISSING.code: "the expected GPU count is compared with NVML's",
    XID_REPEATED.code: "fed by XIDs (rule xid), not by a field of its own",
    RESET_REQUIRED.code: "an NVML error code, not a DCGM field",
    FABRIC_NOT_READY.code: "NVML's GPU fabric info (nvmlDeviceGetGpuFabricInfoV)",
    FABRIC_DEGRADED.code: "NVML's GPU fabric info health mask",
    SXID_FATAL.code: "the kernel log's NVSwitch SXid lines",
    **{v.code: "the NICs' sysfs, read by the RDMA source (rdma:)" for v in RAIL_VERDICTS},
    **{
        v.code: "DCGM_FI_DEV_GPU_RECOVERY_ACTION needs DCGM 4.5 (dcgm-exporter 4.8); older "
        "exporters refuse a counters CSV that names it, so it is not read; the kernel log's "
        "XID 154 carries the same action"
        for v in RECOVERY.values()
    },
}
"""Rules that never see dcgm-exporter data, and why (docs/operations.md)."""


def blind_rules(seen: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Rule -> its fields, for every rule none of whose fields is among ``seen``."""
    return {
        rule: fields for rule, fields in RULE_FIELDS.items() if not any(f in seen for f in fields)
    }
