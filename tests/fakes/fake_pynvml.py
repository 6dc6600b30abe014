"""A fake NVML with pynvml's function names, signatures, error classes and return shapes.

``FakeNvml`` is duck-typed like the ``pynvml`` module: the source calls the same functions
on it. Errors are the real ``pynvml.NVMLError`` subclasses with the real codes (the fake
imports only pynvml's pure-Python error classes and constants; the shared library is never
loaded). Tests steer it through :class:`FakeGpu` fields: ``unsupported`` names functions that
raise NOT_SUPPORTED, ``lost`` makes every call raise GPU_IS_LOST, ``hang`` (a
``threading.Event``) blocks every call on that GPU until it is set, ``errors`` makes named
functions raise a given NVML error code (e.g. ``NVML_ERROR_RESET_REQUIRED``),
``field_errors`` gives one field of ``nvmlDeviceGetFieldValues`` a per-field ``nvmlReturn``.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

NVMLError = _real.NVMLError


def _err(code: int) -> _real.NVMLError:
    return _real.NVMLError(code)  # pynvml maps the code to its subclass, e.g. NVMLError_GpuIsLost


@dataclass
class FakeMig:
    """One MIG device (GPU instance + compute instance) of a FakeGpu in MIG mode."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    profile_id: int = 19
    """GPU instance profile (19: 1g.10gb on H100)."""
    placement_start: int = 0
    placement_size: int = 1
    memory_total: int = 10 * 1024**3
    memory_used: int = 0
    processes: list[int] = field(default_factory=list)
    """PIDs of the compute processes on the instance."""


MIG_NOT_SUPPORTED = frozenset({"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"})
"""What NVML answers NOT_SUPPORTED for on a GPU in MIG mode and on MIG device handles."""


@dataclass
class FakeGpu:
    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1653223000001"
    memory_total: int = 80 * 1024**3
    memory_used: int = 10 * 1024**3
    temperature: int = 45
    memory_temperature: int = 50
    slowdown: int = 89
    shutdown: int = 92
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    util_gpu: int = 70
    util_mem: int = 40
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    clocks_event_mask: int = 0
    sbe_volatile: int = 0
    dbe_volatile: int = 0
    sbe_aggregate: int = 2
    dbe_aggregate: int = 0
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    pcie_replays: int = 0
    nvlink_states: list[int] = field(default_factory=lambda: [1] * 18)
    nvlink_error_per_counter: int = 0
    nvlink_unsupported: set[tuple[int, int]] = field(default_factory=set)
    """(link, counter) pairs whose nvmlDeviceGetNvLinkErrorCounter answers NOT_SUPPORTED."""
    nvlink_state_unsupported: set[int] = field(default_factory=set)
    """Links whose nvmlDeviceGetNvLinkState answers NOT_SUPPORTED."""
    nvlink_fields: bool = True
    """The per-link NVLink error fields (161-163, scope = link) are supported."""
    fan_percent: int = 0
    pstate: int = 0
    mig_mode: int = 0
    migs: list[FakeMig] = field(default_factory=list)
    """The MIG devices (slots in order) while ``mig_mode`` is 1."""
    minor: int | None = None
    """``/dev/nvidia<minor>``; ``None``: the GPU's index."""
    process_util: list[tuple[int, int]] = field(default_factory=list)
    """(pid, smUtil %) samples."""
    unsupported: set[str] = field(
        default_factory=lambda: {
            "nvmlDeviceGetFanSpeed",
            "nvmlDeviceGetRetiredPages",
            "nvmlDeviceGetRetiredPagesPendingStatus",
        }
    )
    recovery_action: int = 0
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t)."""
    fabric_state: int = 0
    """nvmlDeviceGetGpuFabricInfoV's state (0 NOT_SUPPORTED, as an HGX/PCIe GPU answers;
    3 COMPLETED on a registered NVL72 GPU)."""
    fabric_cluster: bytes = bytes(16)
    """The 16 cluster-UUID bytes (all zero before registration)."""
    fabric_clique: int = 0
    fabric_status: int = 0
    """The registration's NVML return code."""
    fabric_health_mask: int = 0
    field_errors: dict[int, int] = field(default_factory=dict)
    """Field id -> the nvmlReturn of that field in nvmlDeviceGetFieldValues."""
    errors: dict[str, int] = field(default_factory=dict)
    """Function name -> NVML error code it raises."""
    lost: bool = False
    hang: threading.Event | None = None
    calls: Counter[str] = field(default_factory=Counter)


class FakeHandle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass(frozen=True)
class FakeMigHandle:
    """A MIG device handle: its parent GPU, its slot and (like a real handle, which is new
    for a new instance) the instance's UUID."""

    parent: int
    slot: int
    uuid: str


@dataclass(frozen=True)
class FakeGpuInstance:
    parent: int
    gpu_instance_id: int


class FakeEventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: dict[int, int] = {}


class FakeNvml:
    """Stands in for the ``pynvml`` module."""

    def __init__(
        self, gpus: list[FakeGpu], *, driver: str = "570.133.20", cuda: int = 12080
    ) -> None:
        for name in dir(_real):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks", "NVMLError")):
                setattr(self, name, getattr(_real, name))
        self.c_nvmlGpuFabricInfoV_t = _real.c_nvmlGpuFabricInfoV_t
        self.c_nvmlGpuFabricInfo_t = _real.c_nvmlGpuFabricInfo_t
        self.gpus = gpus
        self.visible = len(gpus)
        """How many GPUs nvmlDeviceGetCount reports (lower it to simulate a missing GPU)."""
        self.driver = driver
        self.cuda = cuda
        self.initialized = False
        self.init_calls = 0
        self.event_sets: list[FakeEventSet] = []
        self.shutdown_threads: list[str] = []
        """The thread each nvmlShutdown call ran in."""
        self.shutdown_hang: threading.Event | None = None
        """Set: nvmlShutdown blocks until it is set."""
        self._handles = [FakeHandle(i) for i in range(len(gpus))]
        self.supported_events = (
            _real.nvmlEventTypeXidCriticalError
            | _real.nvmlEventTypeDoubleBitEccError
            | _real.nvmlEventTypeSingleBitEccError
            | _real.nvmlEventTypeGpuRecoveryAction
        )

    # ----------------------------------------------------------------- test helpers

    def inject_event(self, index: int, event_type: int, data: int = 0) -> None:
        for es in self.event_sets:
            if es.registered.get(index, 0) & event_type:
                es.queue.put(
                    SimpleNamespace(
                        device=self._handles[index],
                        eventType=event_type,
                        eventData=data,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
                )

    def inject_xid(self, index: int, xid: int) -> None:
        self.inject_event(index, _real.nvmlEventTypeXidCriticalError, xid)

    def inject_recovery_action(self, index: int, value: int) -> None:
        """The driver changes the GPU's recovery action and signals it (the field first)."""
        self.gpus[index].recovery_action = value
        self.inject_event(index, _real.nvmlEventTypeGpuRecoveryAction, value)

    # ----------------------------------------------------------------- plumbing

    def _check_init(self) -> None:
        if not self.initialized:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)

    def _mig(self, handle: FakeMigHandle, fn: str) -> FakeMig:
        g = self._dev(FakeHandle(handle.parent), fn, mig=True)
        if fn in MIG_NOT_SUPPORTED:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        for m in g.migs if g.mig_mode == 1 else ():
            if m.uuid == handle.uuid:
                return m
        raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)  # the instance is gone

    def _dev(self, handle: Any, fn: str, *, mig: bool = False) -> FakeGpu:
        self._check_init()
        if not isinstance(handle, FakeHandle):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[handle.index]
        g.calls[f"mig:{fn}" if mig else fn] += 1
        if g.hang is not None:
            g.hang.wait()
        if g.lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported or (g.mig_mode == 1 and fn in MIG_NOT_SUPPORTED):
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if fn in g.errors:
            raise _err(g.errors[fn])
        return g

    # ----------------------------------------------------------------- system

    def nvmlInit(self) -> None:
        self.init_calls += 1
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.shutdown_threads.append(threading.current_thread().name)
        if self.shutdown_hang is not None:
            self.shutdown_hang.wait()
        self._check_init()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return self.visible

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init()
        if not 0 <= index < self.visible:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    # ----------------------------------------------------------------- identity

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, FakeMigHandle):
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        g = self._dev(handle, "nvmlDeviceGetMinorNumber")
        return handle.index if g.minor is None else g.minor

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> SimpleNamespace:
        g = self._dev(handle, "nvmlDeviceGetPciInfo_v3")
        dom, bus, rest = g.pci_bus_id.split(":")
        return SimpleNamespace(
            busIdLegacy=g.pci_bus_id[4:].encode(),
            domain=int(dom, 16),
            bus=int(bus, 16),
            device=int(rest.split(".")[0], 16),
            pciDeviceId=0x233010DE,
            pciSubSystemId=0x16C110DE,
            busId=g.pci_bus_id.encode(),
        )

    nvmlDeviceGetPciInfo = nvmlDeviceGetPciInfo_v3

    # ----------------------------------------------------------------- telemetry

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._dev(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        g = self._dev(handle, "nvmlDeviceGetTemperatureThreshold")
        if threshold == _real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return g.slowdown
        if threshold == _real.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return g.shutdown
        raise _err(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetFieldValues(
        self, handle: Any, field_ids: list[int | tuple[int, int]]
    ) -> list[SimpleNamespace]:
        g = self._dev(handle, "nvmlDeviceGetFieldValues")
        values: dict[int | tuple[int, int], int] = {
            _real.NVML_FI_DEV_MEMORY_TEMP: g.memory_temperature,
            _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: g.recovery_action,
        }
        if g.nvlink_fields:
            for fid in (
                _real.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                _real.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                _real.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            ):
                for link in range(len(g.nvlink_states)):
                    values[(fid, link)] = g.nvlink_error_per_counter
        out = []
        for fid in field_ids:
            ret = g.field_errors.get(
                fid, _real.NVML_SUCCESS if fid in values else _real.NVML_ERROR_NOT_SUPPORTED
            )
            ok = ret == _real.NVML_SUCCESS
            val = values.get(fid, 0) if ok else 0
            out.append(
                SimpleNamespace(
                    fieldId=fid[0] if isinstance(fid, tuple) else fid,
                    scopeId=fid[1] if isinstance(fid, tuple) else 0,
                    timestamp=0,
                    latencyUsec=0,
                    valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlReturn=ret,
                    value=SimpleNamespace(
                        uiVal=val, ulVal=val, ullVal=val, sllVal=val, siVal=val, dVal=float(val)
                    ),
                )
            )
        return out

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        if isinstance(handle, FakeMigHandle):
            self._mig(handle, "nvmlDeviceGetUtilizationRates")
        g = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        if isinstance(handle, FakeMigHandle):
            m = self._mig(handle, "nvmlDeviceGetMemoryInfo")
            return SimpleNamespace(
                total=m.memory_total, free=m.memory_total - m.memory_used, used=m.memory_used
            )
        g = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            total=g.memory_total, free=g.memory_total - g.memory_used, used=g.memory_used
        )

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g = self._dev(handle, "nvmlDeviceGetClockInfo")
        return g.sm_clock_mhz if type == _real.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons").clocks_event_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clocks_event_mask

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        g = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        corrected = errorType == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counterType == _real.NVML_VOLATILE_ECC:
            return g.sbe_volatile if corrected else g.dbe_volatile
        return g.sbe_aggregate if corrected else g.dbe_aggregate

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        g = self._dev(device, "nvmlDeviceGetRetiredPages")
        dbe = sourceFilter == _real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return list(g.retired_dbe if dbe else g.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        return self._dev(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._dev(device, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        g = self._dev(device, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < len(g.nvlink_states):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if link in g.nvlink_state_unsupported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.nvlink_states[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        g = self._dev(device, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < len(g.nvlink_states):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if (link, counter) in g.nvlink_unsupported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.nvlink_error_per_counter

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        """Fills the struct passed by reference (``ctypes.byref``), like the real call."""
        g = self._dev(device, "nvmlDeviceGetGpuFabricInfoV")
        info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)
        if getattr(info, "version", None) != _real.nvmlGpuFabricInfo_v2:
            raise _err(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.clusterUuid[:] = list(g.fabric_cluster)
        info.status = g.fabric_status
        info.cliqueId = g.fabric_clique
        info.state = g.fabric_state
        info.healthMask = g.fabric_health_mask
        return int(_real.NVML_SUCCESS)

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetFanSpeed").fan_percent

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        g = self._dev(device, "nvmlDeviceGetMigMode")
        return [g.mig_mode, g.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._dev(device, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> FakeMigHandle:
        g = self._dev(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if g.mig_mode != 1:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(g.migs):
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(device.index, index, g.migs[index].uuid)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        if not isinstance(device, FakeMigHandle):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        if not isinstance(device, FakeMigHandle):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> FakeGpuInstance:
        g = self._dev(device, "nvmlDeviceGetGpuInstanceById")
        if not any(m.gpu_instance_id == gpuInstanceId for m in g.migs):
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return FakeGpuInstance(device.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: FakeGpuInstance) -> SimpleNamespace:
        g = self._dev(FakeHandle(gpuInstance.parent), "nvmlGpuInstanceGetInfo")
        m = next(m for m in g.migs if m.gpu_instance_id == gpuInstance.gpu_instance_id)
        return SimpleNamespace(
            device=FakeHandle(gpuInstance.parent),
            id=m.gpu_instance_id,
            profileId=m.profile_id,
            placement=SimpleNamespace(start=m.placement_start, size=m.placement_size),
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        """On a MIG handle: the instance's processes; on a GPU: none (see
        :class:`~tests.fakes.fake_pynvml_processes.FakeNvmlProcesses`)."""
        if isinstance(handle, FakeMigHandle):
            m = self._mig(handle, "nvmlDeviceGetComputeRunningProcesses")
            return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in m.processes]
        self._dev(handle, "nvmlDeviceGetComputeRunningProcesses")
        return []

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[SimpleNamespace]:
        g = self._dev(handle, "nvmlDeviceGetProcessUtilization")
        if not g.process_util:
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return [
            SimpleNamespace(
                pid=pid, timeStamp=timeStamp + 1, smUtil=sm, memUtil=0, encUtil=0, decUtil=0
            )
            for pid, sm in g.process_util
        ]

    # ----------------------------------------------------------------- events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init()
        es = FakeEventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetSupportedEventTypes")
        return self.supported_events

    def nvmlDeviceRegisterEvents(
        self, handle: Any, eventTypes: int, eventSet: FakeEventSet
    ) -> None:
        self._dev(handle, "nvmlDeviceRegisterEvents")
        eventSet.registered[handle.index] = eventSet.registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> SimpleNamespace:
        self._check_init()
        try:
            return eventSet.queue.get(timeout=timeoutms / 1000.0)
        except queue.Empty:
            raise _err(_real.NVML_ERROR_TIMEOUT) from None

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        if eventSet in self.event_sets:
            self.event_sets.remove(eventSet)


def h100_node(n: int = 8) -> FakeNvml:
    """``n`` H100s with distinct UUIDs and PCI addresses."""
    return FakeNvml(
        [
            FakeGpu(
                uuid=f"GPU-{i:08x}-1111-2222-3333-444444444444",
                pci_bus_id=f"00000000:{0x18 + 0x11 * i:02X}:00.0",
            )
            for i in range(n)
        ]
    )


def nvl72_tray(
    cluster: bytes = bytes.fromhex("5f0c7e1a2b3c4d5e8f90a1b2c3d4e5f6"), clique: int = 7, n: int = 4
) -> FakeNvml:
    """One GB200 NVL72 compute tray: ``n`` GPUs registered with the rack's fabric."""
    nvml = h100_node(n)
    for g in nvml.gpus:
        g.name = "NVIDIA GB200"
        g.fabric_state = _real.NVML_GPU_FABRIC_STATE_COMPLETED
        g.fabric_cluster = cluster
        g.fabric_clique = clique
        g.fabric_health_mask = FABRIC_HEALTHY_MASK
    return nvml


FABRIC_HEALTHY_MASK = (
    (_real.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE << 0)
    | (_real.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE << 2)
    | (_real.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE << 4)
    | (_real.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE << 6)
)
"""A healthy fabric's mask: every field FALSE."""
