#!/usr/bin/env python3
"""Read-only NVML probe: what does this node's driver answer to the newer NVML entry points?

Prints one JSON document: driver and NVML versions, and per GPU its name, UUID, PCI bus id,
persistence mode, MIG mode (current, pending), and for each of
``nvmlEventSetRegisterGpuOperationalEvents_v1`` (GPU Operational Events, R615+),
``nvmlSystemGetCPER_v1`` (UEFI CPER records) and ``nvmlDeviceGetGpuFabricInfoV`` (NVLink fabric)
whether it answers, or which NVMLError it raises. It changes nothing on the node: it registers an
event set of its own (freed before exit), drains what that set already holds without waiting
(``timeoutMs=0``), and reads CPER with a fresh cursor.

Uses only pynvml (nvidia-ml-py) and the standard library:
``python3 hack/nvml-probe.py [--cper-pages N] [--max-events N]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

import pynvml as n


def _error_names() -> dict[int, str]:
    names: dict[int, str] = {}
    for name in dir(n):
        if name.startswith("NVML_ERROR_"):
            value = getattr(n, name)
            if isinstance(value, int):
                names.setdefault(value, name)
    return names


_ERRORS = _error_names()


def _err(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, n.NVMLError):
        value = getattr(exc, "value", None)
        return {
            "ok": False,
            "error": _ERRORS.get(value, str(value)) if isinstance(value, int) else str(value),
            "code": value,
            "message": str(exc),
        }
    return {"ok": False, "error": type(exc).__name__, "message": str(exc)}


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return value


def _has_symbol(name: str) -> bool | None:
    """Whether libnvidia-ml exports ``name`` (None: could not tell)."""
    try:
        n._nvmlGetFunctionPointer(name)
        return True
    except n.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(n, "NVML_ERROR_FUNCTION_NOT_FOUND", -1):
            return False
        return None
    except Exception:
        return None


def _call(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": True, "value": _text(fn(*args))}
    except Exception as exc:
        return _err(exc)


def _record(w: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, _ctype in w._fields_:
        out[field] = _text(getattr(w, field))
    return out


def _operational_events(uuid: bytes, max_events: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "symbol_register": _has_symbol("nvmlEventSetRegisterGpuOperationalEvents_v1"),
        "symbol_wait_v3": _has_symbol("nvmlEventSetWait_v3"),
        "symbol_legacy_xid_context": _has_symbol(
            "nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1"
        ),
    }
    try:
        event_set = n.nvmlEventSetCreate()
    except Exception as exc:
        result["register"] = {"step": "nvmlEventSetCreate", **_err(exc)}
        return result
    try:
        config = n.c_nvmlGpuOperationalEventConfig_v1_t(
            uuid=uuid,
            minLogLevel=n.NVML_GPU_OPERATIONAL_EVENT_LOG_LEVEL_ALL,
            minSeverity=n.NVML_OPERATIONAL_EVENT_SEVERITY_ALL,
        )
        try:
            n.nvmlEventSetRegisterGpuOperationalEvents_v1(event_set, config)
            result["register"] = {"ok": True}
        except Exception as exc:
            result["register"] = _err(exc)
            return result
        records: list[dict[str, Any]] = []
        wait: dict[str, Any] = {"ok": True}
        for _ in range(max_events):
            params = n.c_nvmlEventSetWait_v3_t()
            params.timeoutMs = 0
            try:
                n.nvmlEventSetWait_v3(event_set, params)
            except Exception as exc:
                wait = _err(exc)
                break
            rec = _record(params)
            if params.dataType == n.NVML_EVENT_DATA_TYPE_GPU_OPERATIONAL_EVENT:
                xid = n.c_nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1_t()
                xid.index = 0
                try:
                    n.nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1(event_set, xid)
                    rec["legacy_xid"] = int(xid.xidCode)
                except Exception as exc:
                    rec["legacy_xid"] = _err(exc)
            records.append(rec)
        result["wait_v3_timeout0"] = wait
        result["pending_records"] = records
    finally:
        try:
            n.nvmlEventSetFree(event_set)
        except Exception as exc:
            result["free"] = _err(exc)
    return result


def _cper(uuid: bytes, pages: int) -> dict[str, Any]:
    result: dict[str, Any] = {"symbol": _has_symbol("nvmlSystemGetCPER_v1")}
    size = 64 * 1024
    handle = n.NVML_CPER_CURSOR_HANDLE_INIT
    calls: list[dict[str, Any]] = []
    total = 0
    for _ in range(pages):
        buf = (ctypes.c_ubyte * size)()
        req = n.c_nvmlGetCPER_v1_t()
        req.cursor.cperTypeMask = n.NVML_CPER_ACCESS_TYPE_GPU
        req.cursor.uuid = uuid
        req.cursor.handle = handle
        req.buffer = ctypes.cast(buf, ctypes.POINTER(ctypes.c_ubyte))
        req.bufferSize = size
        try:
            n.nvmlSystemGetCPER_v1(req)
        except Exception as exc:
            entry = {**_err(exc), "bufferSize_after": int(req.bufferSize)}
            calls.append(entry)
            insufficient = getattr(n, "NVML_ERROR_INSUFFICIENT_SIZE", -1)
            if getattr(exc, "value", None) == insufficient and 0 < req.bufferSize <= 16 << 20:
                size = int(req.bufferSize)
                continue
            break
        got = int(req.bufferSize)
        total += got
        calls.append(
            {
                "ok": True,
                "bytes": got,
                "handle_before": int(handle),
                "handle_after": int(req.cursor.handle),
                "head_hex": bytes(buf[: min(got, 64)]).hex(),
                "signature": bytes(buf[:4]).decode("ascii", "replace") if got >= 4 else "",
            }
        )
        if got == 0 or int(req.cursor.handle) == handle:
            break
        handle = int(req.cursor.handle)
    result["calls"] = calls
    result["total_bytes"] = total
    return result


def _fabric(handle: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"symbol": _has_symbol("nvmlDeviceGetGpuFabricInfoV")}
    for cls_name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
        cls = getattr(n, cls_name, None)
        if cls is None:
            continue
        info = cls()
        try:
            n.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except Exception as exc:
            result[cls_name] = _err(exc)
            continue
        out = _record(info)
        out["clusterUuid"] = bytes(info.clusterUuid).hex()
        result[cls_name] = {"ok": True, "value": out}
        break
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cper-pages", type=int, default=8)
    parser.add_argument("--max-events", type=int, default=16)
    args = parser.parse_args()
    report: dict[str, Any] = {"probe": "gpuhealth hack/nvml-probe.py", "time": time.time()}
    report["pynvml_module"] = getattr(n, "__file__", None)
    try:
        n.nvmlInit()
    except Exception as exc:
        report["init"] = _err(exc)
        print(json.dumps(report, indent=2, default=str))
        return 1
    try:
        report["driver_version"] = _call(n.nvmlSystemGetDriverVersion)
        report["nvml_version"] = _call(n.nvmlSystemGetNVMLVersion)
        report["cuda_driver_version"] = _call(n.nvmlSystemGetCudaDriverVersion)
        count = n.nvmlDeviceGetCount()
        report["device_count"] = count
        gpus: list[dict[str, Any]] = []
        for index in range(count):
            gpu: dict[str, Any] = {"index": index}
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                gpu["handle"] = _err(exc)
                gpus.append(gpu)
                continue
            gpu["name"] = _call(n.nvmlDeviceGetName, handle)
            uuid_r = _call(n.nvmlDeviceGetUUID, handle)
            gpu["uuid"] = uuid_r
            pci = _call(n.nvmlDeviceGetPciInfo, handle)
            if pci.get("ok"):
                pci = {"ok": True, "value": _text(pci["value"].busId)}
            gpu["pci_bus_id"] = pci
            gpu["persistence_mode"] = _call(n.nvmlDeviceGetPersistenceMode, handle)
            gpu["mig_mode"] = _call(n.nvmlDeviceGetMigMode, handle)
            gpu["supported_event_types"] = _call(n.nvmlDeviceGetSupportedEventTypes, handle)
            uuid = str(uuid_r.get("value", "")).encode()
            gpu["nvmlEventSetRegisterGpuOperationalEvents_v1"] = _operational_events(
                uuid, args.max_events
            )
            gpu["nvmlSystemGetCPER_v1"] = _cper(uuid, args.cper_pages)
            gpu["nvmlDeviceGetGpuFabricInfoV"] = _fabric(handle)
            gpus.append(gpu)
        report["gpus"] = gpus
    finally:
        try:
            n.nvmlShutdown()
        except Exception as exc:
            report["shutdown"] = _err(exc)
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
