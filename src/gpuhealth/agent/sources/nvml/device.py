"""Reading one GPU through NVML, in that GPU's own thread: its identity at start, then one
sample per poll, with its MIG devices, its NVLinks and NVML field values.

**A sample.** NOT_SUPPORTED means "absent" (``None``, and that call is not repeated for the
GPU); GPU_IS_LOST raises :class:`GpuLost`; RESET_REQUIRED leaves the field absent and marks the
sample ``reset_required`` (a health signal); any other error leaves the field absent and is
counted. The driver's GPU recovery action (field 230) is read with the memory temperature, in
one nvmlDeviceGetFieldValues call (:func:`field_int`, :func:`read_recovery_action`, also for
the event waiter).

**MIG** (:class:`MigReader`). Each poll enumerates the MIG device handles
(``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot answers NOT_FOUND). What does not
change while an instance exists (its UUID, GPU and compute instance ids, GPU instance profile
and placement) is read once per handle; the memory in use and the compute processes are read
every poll. NVML does not give utilisation rates on MIG handles (NOT_SUPPORTED; per-instance SM
activity needs GPM, not read here), so an instance's utilisation is 0 when no process runs on
it and unknown otherwise.

**NVLink** (:class:`NvlinkReader`). Support is tracked per (link, counter): one NOT_SUPPORTED
counter hides only itself, and a link whose four legacy counters (DL replay, recovery, CRC
flit, CRC data) all answer NOT_SUPPORTED, as on NVLink5 drivers, is read through its per-link
error fields (161-163, scope id = the link) instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.health import recovery_action
from gpuhealth.agent.observations import GpuIdentity, GpuSample, MigDevice
from gpuhealth.agent.sources.nvml.fabric_reader import FabricReader
from gpuhealth.agent.sources.nvml.gpu import GpuLost, NvmlGpu
from gpuhealth.common.clock import Clock

T = TypeVar("T")


def handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML device handle (ctypes pointers compare by address)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


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


NVML_FIELD_ERRORS = CounterSpec(
    "nvml_field_errors",
    "NVML calls that failed with an error other than NOT_SUPPORTED and RESET_REQUIRED (the "
    "field is left absent).",
)

_THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "applications_clocks"),
    (0x4, "power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
)


class NvmlReader:
    """The NVML calls that read one GPU (the module is pynvml, or a fake in tests)."""

    def __init__(
        self,
        nvml: Any,
        clock: Clock,
        counters: Counters,
        *,
        process_utilization: bool,
        mig_recheck_s: float = 60.0,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self.counters = counters
        self.process_utilization = process_utilization
        self.mig_recheck_s = mig_recheck_s
        self._mig = MigReader(nvml, self.opt)
        self._links = NvlinkReader(nvml, self.opt)
        self._fabric = FabricReader(nvml, self.opt)

    def opt(self, g: NvmlGpu, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """One NVML call: NOT_SUPPORTED -> None (and not asked again), GPU_IS_LOST -> _Lost."""
        if key in g.unsupported:
            return None
        n = self._nvml
        try:
            return fn(*args)
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == n.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"NVML: GPU is lost ({key})") from exc
            if code in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND):
                g.unsupported.add(key)
            elif code == n.NVML_ERROR_RESET_REQUIRED:
                g.reset_required = True
            elif code not in (n.NVML_ERROR_NOT_FOUND, n.NVML_SUCCESS):
                # NOT_FOUND: nothing to report (no process samples, empty MIG slot);
                # SUCCESS: pynvml raises it for "zero process samples".
                self.counters.inc(NVML_FIELD_ERRORS)
            return None

    def open(self, i: int) -> NvmlGpu:
        """One GPU's identity and static facts (system thread)."""
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(i)
        pci = n.nvmlDeviceGetPciInfo_v3(h).busId
        pci = pci.decode() if isinstance(pci, bytes) else str(pci)
        blank = GpuIdentity(index=i, uuid="", model="", pci_bus_id="")
        scratch = NvmlGpu(i, h, blank, None, None, ())
        mig = self.opt(scratch, "mig", n.nvmlDeviceGetMigMode, h)
        mem = self.opt(scratch, "mem", n.nvmlDeviceGetMemoryInfo, h)
        ident = GpuIdentity(
            index=i,
            uuid=str(n.nvmlDeviceGetUUID(h)),
            model=str(n.nvmlDeviceGetName(h)),
            pci_bus_id=pci.upper(),
            serial=self.opt(scratch, "serial", n.nvmlDeviceGetSerial, h),
            memory_total_bytes=None if mem is None else int(mem.total),
            mig_enabled=bool(mig and mig[0] == 1),
            minor_number=self.opt(scratch, "minor", n.nvmlDeviceGetMinorNumber, h),
        )
        th = n.nvmlDeviceGetTemperatureThreshold
        slow = self.opt(scratch, "t_slow", th, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shut = self.opt(scratch, "t_shut", th, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        links = []
        for link in range(min(MAX_LINKS, int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)))):
            try:
                n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError:
                continue  # no such link (links may be sparse: keep looking)
            links.append(link)
        return NvmlGpu(i, h, ident, _f(slow), _f(shut), tuple(links))

    def read(self, g: NvmlGpu, *, nvlink: bool) -> GpuSample:
        """One GPU's sample (in that GPU's thread); ``nvlink``: read the NVLink counters
        this time (else the cached ones are reported)."""
        n, h, opt = self._nvml, g.handle, self.opt
        g.reset_required = False
        temp = opt(g, "temp", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        fields = self.fields(g)
        mem_temp = _f(fields.get("memtemp"))
        recovery = fields.get("recovery")
        power = opt(g, "power", n.nvmlDeviceGetPowerUsage, h)
        limit = opt(g, "plimit", n.nvmlDeviceGetEnforcedPowerLimit, h)
        util = opt(g, "util", n.nvmlDeviceGetUtilizationRates, h)
        mem = opt(g, "mem", n.nvmlDeviceGetMemoryInfo, h)
        sm = opt(g, "smclk", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        mclk = opt(g, "memclk", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)
        events_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        mask = None if events_fn is None else opt(g, "throttle", events_fn, h)
        if mask is None and (events_fn is None or "throttle" in g.unsupported):
            # drivers and bindings from before the rename to "clocks event reasons"
            mask = opt(g, "throttle_old", n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        ecc = n.nvmlDeviceGetTotalEccErrors
        corr, unc = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        sbe_v = opt(g, "ecc", ecc, h, corr, vol)
        dbe_v = opt(g, "ecc", ecc, h, unc, vol)
        sbe_a = opt(g, "ecc", ecc, h, corr, agg)
        dbe_a = opt(g, "ecc", ecc, h, unc, agg)
        rp = n.nvmlDeviceGetRetiredPages
        rp_sbe = opt(
            g, "retired", rp, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        rp_dbe = opt(g, "retired", rp, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        rp_pend = opt(g, "retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        remap = opt(g, "remap", n.nvmlDeviceGetRemappedRows, h)
        pcie = opt(g, "pcie", n.nvmlDeviceGetPcieReplayCounter, h)
        fan = opt(g, "fan", n.nvmlDeviceGetFanSpeed, h)
        pstate = opt(g, "pstate", n.nvmlDeviceGetPerformanceState, h)
        mig = self._mig_mode(g)
        mig_on = bool(mig and mig[0] == 1)
        mig_devices = self._mig.read(g) if mig_on else (None if mig is None else ())
        if nvlink:
            g.nvlink_cache = self._links.read(g)
        links_up, links_total, nvl_err = g.nvlink_cache
        fabric = self._fabric.read(g)
        return GpuSample(
            uuid=g.identity.uuid,
            at=self._clock.now(),
            temperature_c=_f(temp),
            memory_temperature_c=mem_temp,
            slowdown_temperature_c=g.slowdown_c,
            shutdown_temperature_c=g.shutdown_c,
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            utilization_ratio=None if util is None else util.gpu / 100.0,
            memory_utilization_ratio=None if util is None else util.memory / 100.0,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            sm_clock_hz=None if sm is None else sm * 1e6,
            memory_clock_hz=None if mclk is None else mclk * 1e6,
            throttle_reasons=None if mask is None else throttle_reason_names(int(mask)),
            ecc_sbe_volatile=sbe_v,
            ecc_dbe_volatile=dbe_v,
            ecc_sbe_aggregate=sbe_a,
            ecc_dbe_aggregate=dbe_a,
            retired_pages_sbe=None if rp_sbe is None else len(rp_sbe),
            retired_pages_dbe=None if rp_dbe is None else len(rp_dbe),
            retired_pages_pending=None if rp_pend is None else bool(rp_pend),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            row_remap_pending=None if remap is None else bool(remap[2]),
            row_remap_failure=None if remap is None else bool(remap[3]),
            pcie_replay_count=pcie,
            nvlink_links_up=links_up,
            nvlink_links_total=links_total,
            nvlink_errors=nvl_err,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            performance_state=pstate,
            mig_mode=None if mig is None else mig_on,
            mig_instances=None if mig_devices is None else len(mig_devices),
            mig_devices=mig_devices,
            process_utilization=self._process_util(g) if self.process_utilization else {},
            recovery_action=recovery,
            reset_required=g.reset_required,
            fabric=fabric,
        )

    def fields(self, g: NvmlGpu, only: tuple[str, ...] = ()) -> dict[str, int]:
        """The field values this GPU supports (``memtemp``, ``recovery``), in one call; a
        field answering NOT_SUPPORTED is not asked again."""
        n = self._nvml
        wanted = [
            (key, fid)
            for key, fid in (
                ("memtemp", n.NVML_FI_DEV_MEMORY_TEMP),
                (
                    "recovery",
                    getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", recovery_action.FIELD_ID),
                ),
            )
            if key not in g.unsupported and (not only or key in only)
        ]
        if not wanted:
            return {}
        values = self.opt(g, "fields", n.nvmlDeviceGetFieldValues, g.handle, [f for _, f in wanted])
        if values is None:
            return {}
        out: dict[str, int] = {}
        for (key, _), fv in zip(wanted, values, strict=False):
            ret = fv.nvmlReturn
            if ret == n.NVML_SUCCESS:
                out[key] = field_int(fv)
            elif ret in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND):
                g.unsupported.add(key)
            elif ret == n.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"NVML: GPU is lost ({key})")
            elif ret == n.NVML_ERROR_RESET_REQUIRED:
                g.reset_required = True
            else:
                self.counters.inc(NVML_FIELD_ERRORS)
        return out

    def _mig_mode(self, g: NvmlGpu) -> Any:
        """MIG mode (current, pending). NOT_SUPPORTED is asked again every ``mig_recheck_s``
        (a driver may answer it while a mode change is pending); a change of mode re-probes
        every call that answered NOT_SUPPORTED (utilisation is NOT_SUPPORTED in MIG mode and
        works again without it)."""
        now = self._clock.monotonic()
        if "mig" in g.unsupported and now - g.mig_checked >= self.mig_recheck_s:
            g.unsupported.discard("mig")
            g.mig_checked = now
        mig = self.opt(g, "mig", self._nvml.nvmlDeviceGetMigMode, g.handle)
        on = None if mig is None else bool(mig[0] == 1)
        if on is not None and g.mig_on is not None and on != g.mig_on:
            g.unsupported.clear()
            g.mig_slots.clear()
        if on is not None:
            g.mig_on = on
        return mig

    def _process_util(self, g: NvmlGpu) -> dict[int, float]:
        samples = self.opt(
            g, "proc_util", self._nvml.nvmlDeviceGetProcessUtilization, g.handle, g.process_ts
        )
        if not samples:
            return {}
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = min(1.0, max(0.0, s.smUtil / 100.0))
            g.process_ts = max(g.process_ts, int(s.timeStamp))
        return out


@lru_cache(maxsize=256)
def throttle_reason_names(mask: int) -> frozenset[str]:
    """NVML's clocks-event (throttle) bitmask -> reason names (also DCGM's)."""
    return frozenset(name for bit, name in _THROTTLE_BITS if mask & bit)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


Opt = Callable[..., Any]
"""``NvmlReader.opt``: one NVML call, NOT_SUPPORTED -> None (and not asked again)."""


class MigReader:
    def __init__(self, nvml: Any, opt: Opt) -> None:
        self._nvml = nvml
        self._opt = opt

    def read(self, g: NvmlGpu) -> tuple[MigDevice, ...]:
        n, opt = self._nvml, self._opt
        top = opt(g, "mig_max", n.nvmlDeviceGetMaxMigDeviceCount, g.handle)
        if top is None:
            return ()
        out: list[MigDevice] = []
        seen: dict[int, tuple[Any, MigDevice]] = {}
        for i in range(int(top)):
            mh = opt(g, "mig_dev", n.nvmlDeviceGetMigDeviceHandleByIndex, g.handle, i)
            if mh is None:
                continue
            key = handle_key(mh)
            cached = g.mig_slots.get(i)
            ident = cached[1] if cached is not None and cached[0] == key else self._identity(g, mh)
            if ident is None:
                continue
            seen[i] = (key, ident)
            out.append(self._usage(g, mh, ident))
        g.mig_slots = seen
        return tuple(out)

    def _identity(self, g: NvmlGpu, mh: Any) -> MigDevice | None:
        n, opt = self._nvml, self._opt
        uuid = opt(g, "mig_uuid", n.nvmlDeviceGetUUID, mh)
        if not uuid:
            return None
        gi = opt(g, "mig_gi", n.nvmlDeviceGetGpuInstanceId, mh)
        ci = opt(g, "mig_ci", n.nvmlDeviceGetComputeInstanceId, mh)
        profile = start = size = None
        if gi is not None:
            inst = opt(g, "mig_gi_handle", n.nvmlDeviceGetGpuInstanceById, g.handle, int(gi))
            info = None if inst is None else opt(g, "mig_gi_info", n.nvmlGpuInstanceGetInfo, inst)
            if info is not None:
                profile = int(info.profileId)
                start, size = int(info.placement.start), int(info.placement.size)
        return MigDevice(
            uuid=str(uuid),
            gpu_instance_id=None if gi is None else int(gi),
            compute_instance_id=None if ci is None else int(ci),
            profile_id=profile,
            placement_start=start,
            placement_size=size,
        )

    def _usage(self, g: NvmlGpu, mh: Any, ident: MigDevice) -> MigDevice:
        n, opt = self._nvml, self._opt
        mem = opt(g, "mig_mem", n.nvmlDeviceGetMemoryInfo, mh)
        procs = opt(g, "mig_procs", n.nvmlDeviceGetComputeRunningProcesses, mh)
        count = None if procs is None else len(procs)
        return MigDevice(
            uuid=ident.uuid,
            gpu_instance_id=ident.gpu_instance_id,
            compute_instance_id=ident.compute_instance_id,
            profile_id=ident.profile_id,
            placement_start=ident.placement_start,
            placement_size=ident.placement_size,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            processes=count,
            utilization_ratio=0.0 if count == 0 else None,
        )


MAX_LINKS = 64
_NVLINK_COUNTERS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
_NVLINK_FIELDS = (
    ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", 161),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", 162),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", 163),
)
"""Per-link error fields (scope id = link), where the legacy counters are NOT_SUPPORTED."""


@dataclass(frozen=True, slots=True)
class _LinkKeys:
    """The support keys of one link: its state, each legacy counter, its error fields."""

    state: str
    counters: tuple[str, ...]
    fields: str


_LINK_KEYS = tuple(
    _LinkKeys(f"nvlink{i}", tuple(f"nvlink{i}.err{c}" for c in _NVLINK_COUNTERS), f"nvlink{i}.fv")
    for i in range(MAX_LINKS)
)


class NvlinkReader:
    def __init__(self, nvml: Any, opt: Callable[..., Any]) -> None:
        self._nvml = nvml
        self._opt = opt

    def read(self, g: NvmlGpu) -> tuple[int | None, int | None, int | None]:
        """Links up, links with a state, errors: support is tracked per (link, counter), so
        one NOT_SUPPORTED counter hides only itself. A link whose four legacy counters are all
        NOT_SUPPORTED (NVLink5 drivers) is read through its per-link error fields instead."""
        if not g.links:
            return (None, None, None)
        n, h, opt, unsupported = self._nvml, g.handle, self._opt, g.unsupported
        up = total = errors = 0
        for link in g.links:
            keys = _LINK_KEYS[link]
            state = opt(g, keys.state, n.nvmlDeviceGetNvLinkState, h, link)
            if keys.state in unsupported:
                continue
            total += 1
            if not state:
                continue
            up += 1
            for counter, key in zip(_NVLINK_COUNTERS, keys.counters, strict=True):
                errors += opt(g, key, n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter) or 0
            if unsupported.issuperset(keys.counters):
                errors += self._link_fields(g, link, keys.fields)
        reported = any(
            not unsupported.issuperset(_LINK_KEYS[link].counters)
            or _LINK_KEYS[link].fields not in unsupported
            for link in g.links
        )
        return (up, total, errors if reported else None)

    def _link_fields(self, g: NvmlGpu, link: int, key: str) -> int:
        if key in g.unsupported:
            return 0
        n = self._nvml
        ids = [(getattr(n, name, fid), link) for name, fid in _NVLINK_FIELDS]
        values = self._opt(g, key, n.nvmlDeviceGetFieldValues, g.handle, ids)
        if values is None:
            return 0
        rets = [fv.nvmlReturn for fv in values]
        if all(r in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND) for r in rets):
            g.unsupported.add(key)
            return 0
        return sum(field_int(fv) for fv in values if fv.nvmlReturn == n.NVML_SUCCESS)
