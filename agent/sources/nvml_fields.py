"""Reading NVML field values (``nvmlDeviceGetFieldValues``): the value by its type, and the
recovery-action field on its own (for the event waiter)."""

from __future__ import annotations

from typing import Any

from gpuhealth.agent.health import recovery_action

_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
"""nvmlValueType_t -> the member of nvmlValue_t holding it."""


def field_int(fv: Any) -> int:
    return int(getattr(fv.value, _FIELD_VALUE.get(int(fv.valueType), "uiVal")))


def read_recovery_action(nvml: Any, handle: Any) -> int | None:
    """The GPU's recovery action now (one field read; any error -> None). For the event
    waiter: it leaves the GPU's poll state alone."""
    fid = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", recovery_action.FIELD_ID)
    try:
        (fv,) = nvml.nvmlDeviceGetFieldValues(handle, [fid])
    except (nvml.NVMLError, ValueError):
        return None
    return field_int(fv) if fv.nvmlReturn == nvml.NVML_SUCCESS else None
