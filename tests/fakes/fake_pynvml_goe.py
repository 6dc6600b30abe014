"""The fake NVML learns GPU Operational Events and CPER (R615+), with the real structures.

:class:`FakeNvmlGoe` is :class:`~tests.fakes.fake_pynvml.FakeNvml` plus
``nvmlEventSetRegisterGpuOperationalEvents_v1``, ``nvmlEventSetWait_v3``, the context calls
(count, info, legacy Xid) and ``nvmlSystemGetCPER_v1``, filling pynvml's own ctypes structures
(``c_nvmlEventSetWait_v3_t``, ``c_nvmlGetCPER_v1_t`` ...) with pynvml's constants. ``goe``
says what the driver answers: ``"supported"`` (R615+), ``"function_not_found"`` (a driver
without the entry points: NVML_ERROR_FUNCTION_NOT_FOUND from every new call) or
``"not_supported"`` (the registration answers NVML_ERROR_NOT_SUPPORTED). Tests raise events
with :meth:`FakeNvmlGoe.inject_operational_event`; each also lands in the GPU's CPER log as the
driver renders it (NVIDIA's open kernel modules 615.71.09, ``op_event_log_entry.c``
``_opEventLogEntryRenderCperSubset``): record id = the event group's cursor, one NVIDIA event
section per event (category as the event type, module event code as the sub-type, the module
signature, the legacy Xid context), the section's severity demoted from FATAL to RECOVERABLE
(``_gpuOpEventCperSeverity``), the record flags 0 on R615 (``cperInit``) and the group's
attributes from R620. ``nvmlSystemGetCPER_v1`` is root only: ``cper_root=False`` answers
NVML_ERROR_NO_PERMISSION.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pynvml as _real

from gpuhealth.agent.sources.nvml.cper_record import build_record, nvidia_section
from tests.fakes.fake_pynvml import FakeEventSet, FakeGpu, FakeNvml, _err

Goe = Literal["supported", "function_not_found", "not_supported"]
STRUCTS = (
    "c_nvmlGpuOperationalEventConfig_v1_t",
    "c_nvmlEventSetWait_v3_t",
    "c_nvmlEventSetGetContextCount_v1_t",
    "c_nvmlEventSetGetContextInfo_v1_t",
    "c_nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1_t",
    "c_nvmlCPERCursor_v1_t",
    "c_nvmlGetCPER_v1_t",
)
CPER_SEVERITY = {10: 3, 20: 2, 30: 0, 40: 0}
"""nvmlOperationalEventSeverity_t -> UEFI CPER error severity, as ``_gpuOpEventCperSeverity``
maps it (a FATAL GPU event is a RECOVERABLE host error)."""
GROUP_FLAGS_SINCE = 620


@dataclass(frozen=True)
class GoeRecord:
    uuid: str
    module: str
    code: int
    category: int
    severity: int
    scope: int
    attributes: int
    group_attributes: int
    legacy_xid: int | None
    cursor: int
    log_level: int


class FakeNvmlGoe(FakeNvml):
    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver: str = "620.10.01",
        goe: Goe = "supported",
        cper_root: bool = True,
    ) -> None:
        super().__init__(gpus, driver=driver)
        self.release = int(driver.split(".", 1)[0])
        self.cper_root = cper_root
        for name in (*STRUCTS, "NVML_CPER_ACCESS_TYPE_GPU", "NVML_CPER_CURSOR_HANDLE_INIT"):
            setattr(self, name, getattr(_real, name))
        for name in dir(_real):
            if name.startswith(("NVML_GPU_OPERATIONAL", "NVML_OPERATIONAL", "NVML_EVENT_DATA")):
                setattr(self, name, getattr(_real, name))
        self.goe: Goe = goe
        self.goe_sets: dict[int, tuple[FakeEventSet, set[str], queue.Queue[GoeRecord]]] = {}
        self.last: dict[int, GoeRecord] = {}
        self.cper: dict[str, list[bytes]] = {g.uuid: [] for g in gpus}
        self._cursor = itertools.count(0x1000)

    # ----------------------------------------------------------------- test helpers

    def inject_operational_event(
        self,
        index: int,
        module: str,
        code: int,
        *,
        category: int,
        severity: int,
        scope: int = 0,
        attributes: int = _real.NVML_OPERATIONAL_EVENT_ATTR_PRIMARY,
        group_attributes: int = 0,
        legacy_xid: int | None = None,
        cper: bool = True,
        deliver: bool = True,
    ) -> int:
        """The driver publishes one event group of one event; its cursor."""
        uuid = self.gpus[index].uuid
        rec = GoeRecord(
            uuid, module, code, category, severity, scope, attributes, group_attributes,
            legacy_xid, next(self._cursor), _real.NVML_GPU_OPERATIONAL_EVENT_LOG_LEVEL_ERROR,
        )  # fmt: skip
        if deliver:
            for _es, uuids, q in self.goe_sets.values():
                if uuid in uuids:
                    q.put(rec)
        if cper:
            self.cper[uuid].append(self.cper_record(rec))
        return rec.cursor

    def cper_record(self, rec: GoeRecord) -> bytes:
        """The CPER record of a one-event group, as this driver release renders it."""
        r620 = self.release >= GROUP_FLAGS_SINCE
        sev = CPER_SEVERITY.get(rec.severity, 3)
        section = nvidia_section(
            rec.module,
            rec.category,
            rec.code,
            legacy_xid=rec.legacy_xid,
            info_version=0x0200 if r620 else 0x0100,
            scope=rec.scope,
        )
        return build_record(
            rec.cursor,
            sev,
            rec.group_attributes if r620 else 0,
            datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC),
            sections=[(section, sev)],
        )

    # ----------------------------------------------------------------- operational events

    def _goe_call(self) -> None:
        self._check_init()
        if self.goe == "function_not_found":
            raise _err(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlEventSetRegisterGpuOperationalEvents_v1(
        self, eventSet: FakeEventSet, config: Any
    ) -> None:
        self._goe_call()
        if self.goe == "not_supported":
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        uuid = config.uuid.decode() if isinstance(config.uuid, bytes) else str(config.uuid)
        if uuid not in {g.uuid for g in self.gpus}:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        entry = self.goe_sets.setdefault(id(eventSet), (eventSet, set(), queue.Queue()))
        entry[1].add(uuid)

    def nvmlEventSetWait_v3(self, eventSet: FakeEventSet, params: Any) -> None:
        self._goe_call()
        entry = self.goe_sets.get(id(eventSet))
        if entry is None:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        try:
            rec = entry[2].get(timeout=params.timeoutMs / 1000.0)
        except queue.Empty:
            raise _err(_real.NVML_ERROR_TIMEOUT) from None
        self.last[id(eventSet)] = rec
        params.dataType = _real.NVML_EVENT_DATA_TYPE_GPU_OPERATIONAL_EVENT
        params.uuid = rec.uuid.encode()
        params.sourceModule = rec.module.encode()[:16]
        params.eventType = _real.nvmlEventTypeNone
        params.eventData = 0
        params.groupCursor = rec.cursor
        params.instanceId = rec.cursor
        params.timestampUsec = 1_795_000_000_000_000
        params.gpuInstanceId = _real.NVML_GPU_INSTANCE_ID_ANY
        params.computeInstanceId = _real.NVML_COMPUTE_INSTANCE_ID_ANY
        params.severity = rec.severity
        params.categoryId = rec.category
        params.moduleEventCode = rec.code
        params.scope = rec.scope
        params.logLevel = rec.log_level
        params.attributes = rec.attributes
        params.groupAttributes = rec.group_attributes
        params.groupSize, params.groupIndex = 1, 0

    def nvmlEventSetGetContextCount_v1(self, eventSet: FakeEventSet, params: Any) -> None:
        self._goe_call()
        rec = self.last.get(id(eventSet))
        params.count = 1 if rec is not None and rec.legacy_xid else 0

    def nvmlEventSetGetContextInfo_v1(self, eventSet: FakeEventSet, params: Any) -> None:
        self._goe_call()
        rec = self.last.get(id(eventSet))
        if rec is None or not rec.legacy_xid or params.index != 0:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        params.nvmlGpuOperationalEventContextType = (
            _real.NVML_GPU_OPERATIONAL_EVENT_CONTEXT_TYPE_LEGACY_XID
        )
        params.sourceEventContextType = 1
        params.dataSize = 4
        params.dataFormatVersion = 1

    def nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1(
        self, eventSet: FakeEventSet, params: Any
    ) -> None:
        self._goe_call()
        rec = self.last.get(id(eventSet))
        if rec is None or not rec.legacy_xid or params.index != 0:
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        params.xidCode = rec.legacy_xid

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self.goe_sets.pop(id(eventSet), None)
        super().nvmlEventSetFree(eventSet)

    # ----------------------------------------------------------------- CPER

    def nvmlSystemGetCPER_v1(self, cper: Any) -> None:
        """One record per call after the cursor's handle (as the driver's read path does)."""
        self._goe_call()
        if not self.cper_root:
            raise _err(_real.NVML_ERROR_NO_PERMISSION)
        cur = cper.cursor
        uuid = cur.uuid.decode() if isinstance(cur.uuid, bytes) else str(cur.uuid)
        if not cur.cperTypeMask & _real.NVML_CPER_ACCESS_TYPE_GPU or uuid not in self.cper:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        records = self.cper[uuid]
        pos = int(cur.handle)
        if pos >= len(records):
            cper.bufferSize = 0
            return
        rec = records[pos]
        if not cper.buffer or cper.bufferSize < len(rec):
            cper.bufferSize = len(rec)
            raise _err(_real.NVML_ERROR_INSUFFICIENT_SIZE)
        ctypes.memmove(cper.buffer, rec, len(rec))
        cper.bufferSize = len(rec)
        cur.handle = pos + 1


def goe_node(n: int = 8, **kw: Any) -> FakeNvmlGoe:
    """``n`` H100s (as :func:`~tests.fakes.fake_pynvml.h100_node`) on an R620 driver."""
    return FakeNvmlGoe(
        [
            FakeGpu(
                uuid=f"GPU-{i:08x}-1111-2222-3333-444444444444",
                pci_bus_id=f"00000000:{0x18 + 0x11 * i:02X}:00.0",
            )
            for i in range(n)
        ],
        **kw,
    )
