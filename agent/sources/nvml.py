"""NVML source: per-GPU telemetry polls and an XID / ECC event waiter.

The only module that imports pynvml (tests inject a fake with the same functions). Every
NVML call runs off the event loop: each GPU has its own worker thread, and one GPU's sample
read must finish within ``call_deadline_s``. A read that passes it marks that GPU
unresponsive; the others keep being polled, and the stuck GPU is not asked again until its
hung call returns. NOT_SUPPORTED means "absent" (``None``, and that call is not repeated);
GPU_IS_LOST gives a ``lost`` liveness observation; fewer GPUs than expected, ``missing``.
XID and ECC events come from an NVML event set waited on in a dedicated thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, TypeVar

from msgspec import Meta

from gpuhealth.agent.model import (
    EccEvent,
    GpuIdentity,
    GpuSample,
    Inventory,
    LivenessObservation,
    ObservationSink,
    SourceName,
    XidObservation,
)
from gpuhealth.common.clock import Clock
from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")
T = TypeVar("T")

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
_NVLINK_COUNTERS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA


class NvmlSettings(Settings, frozen=True, kw_only=True):
    poll_interval_s: PositiveSeconds = 1.0
    """Time between polls of every GPU (tools keep >= 1 s: NVML calls are not free)."""
    call_deadline_s: PositiveSeconds = 2.0
    """One GPU's whole sample read must finish within this; otherwise it is unresponsive."""
    init_deadline_s: PositiveSeconds = 60.0
    """nvmlInit and the inventory (slow without persistence mode)."""
    expected_gpus: Annotated[int, Meta(ge=0, le=64)] | None = None
    """GPUs the node should have; ``None``: as many as found at start."""
    event_wait_ms: Annotated[int, Meta(ge=1, le=60_000)] = 500
    """One nvmlEventSetWait; also how quickly the waiter notices shutdown."""
    nvlink_every_polls: PositiveInt = 5
    """NVLink state and error counters (about 90 calls per GPU) are read every Nth poll."""
    process_utilization: bool = True
    """Read per-process SM utilisation (for idle-allocation attribution)."""


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    identity: GpuIdentity
    slowdown_c: float | None
    shutdown_c: float | None
    links: tuple[int, ...]
    unsupported: set[str] = field(default_factory=set)
    executor: _Worker | None = None
    pending: Future[GpuSample] | None = None
    unhealthy: bool = False
    nvlink_cache: tuple[int | None, int | None, int | None] = (None, None, None)
    process_ts: int = 0


class _Lost(Exception):
    pass


class _Worker:
    """One daemon thread running submitted calls in order.

    Daemon, unlike ThreadPoolExecutor's threads: an NVML call that never returns must not
    keep the agent from exiting.
    """

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._q.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._q.put(None)

    def _loop(self) -> None:
        while (item := self._q.get()) is not None:
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


class NvmlSource:
    """A :class:`agent.model.Source` reading GPUs through NVML."""

    name: SourceName = "nvml"

    def __init__(self, settings: NvmlSettings, clock: Clock, nvml_module: Any = None) -> None:
        if nvml_module is None:
            import pynvml

            nvml_module = pynvml
        self._nvml = nvml_module
        self.settings = settings
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._by_pci: dict[str, str] = {}
        self._by_handle: dict[Any, str] = {}
        self._system: _Worker | None = None
        self._counted = 0
        self.call_timeouts_total: dict[int, int] = {}
        """GPU index -> sample reads that passed their deadline."""
        self.field_errors_total = 0
        """Calls that failed with an error other than NOT_SUPPORTED (the field is left absent)."""
        self.events_total = 0
        self.polls_total = 0
        self.last_poll_duration_s = 0.0
        self.up = False
        self.poll_observer: Callable[[float], None] | None = None
        """Called with each poll's duration in seconds (the runtime's histogram)."""
        self.inventory: Inventory | None = None

    def pci_to_uuid(self, pci_bus_id: str) -> str | None:
        """For the kernel-log follower: NVML bus id -> GPU UUID."""
        return self._by_pci.get(pci_bus_id.upper())

    # ----------------------------------------------------------------- lifecycle

    async def run(self, sink: ObservationSink) -> None:
        loop = asyncio.get_running_loop()
        self._system = _Worker("nvml-system")
        stop = threading.Event()
        waiter: threading.Thread | None = None
        try:
            inv = await self._call(self._init, self.settings.init_deadline_s, "nvmlInit")
            self.inventory = inv
            sink(inv)
            expected = self.settings.expected_gpus
            if expected is None:
                expected = self._counted  # a GPU NVML counts but cannot open is missing too
            missing = len(inv.gpus) < expected
            if missing:
                sink(self._missing(len(inv.gpus), expected))
            for g in self._gpus:
                g.executor = _Worker(f"nvml-gpu{g.index}")
            waiter = threading.Thread(
                target=self._wait_events, args=(loop, sink, stop), name="nvml-events", daemon=True
            )
            waiter.start()
            while True:
                started = time.perf_counter()
                results = await asyncio.gather(*(self._poll(g) for g in self._gpus))
                for batch in results:
                    for obs in batch:
                        sink(obs)
                count = await self._call(
                    self._nvml.nvmlDeviceGetCount,
                    self.settings.call_deadline_s,
                    "nvmlDeviceGetCount",
                )
                present = min(count, len(self._gpus))  # a GPU we could not open stays missing
                if present < expected:
                    missing = True
                    sink(self._missing(present, expected))
                elif missing:
                    missing = False
                    sink(
                        LivenessObservation(
                            source="nvml",
                            kind="responsive",
                            at=self._clock.now(),
                            detail=f"all {expected} expected GPUs visible",
                        )
                    )
                self.up = True
                self.polls_total += 1
                self.last_poll_duration_s = time.perf_counter() - started
                if self.poll_observer is not None:
                    self.poll_observer(self.last_poll_duration_s)
                await self._clock.sleep(
                    max(0.0, self.settings.poll_interval_s - self.last_poll_duration_s)
                )
        except BaseException:
            self.up = False
            raise
        finally:
            stop.set()
            for g in self._gpus:
                if g.executor is not None:
                    g.executor.stop()
            self._system.stop()
            if all(g.pending is None for g in self._gpus):
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()

    async def _call(self, fn: Callable[[], T], deadline: float, what: str) -> T:
        assert self._system is not None
        fut = self._system.submit(fn)
        try:
            return await asyncio.wait_for(_shielded(fut), deadline)
        except TimeoutError as exc:
            raise TransientError(f"NVML {what} did not return within {deadline:g} s") from exc
        except self._nvml.NVMLError as exc:
            raise TransientError(f"NVML {what}: {exc}") from exc

    def _missing(self, count: int, expected: int) -> LivenessObservation:
        return LivenessObservation(
            source="nvml",
            kind="missing",
            at=self._clock.now(),
            detail=f"{count} of {expected} expected GPUs visible",
        )

    # ----------------------------------------------------------------- inventory (system thread)

    def _init(self) -> Inventory:
        n = self._nvml
        n.nvmlInit()
        gpus: list[_Gpu] = []
        self._counted = int(n.nvmlDeviceGetCount())
        for i in range(self._counted):
            try:
                gpus.append(self._open(i))
            except (n.NVMLError, _Lost) as exc:  # one broken GPU must not hide the others
                log.error("nvml_gpu_unavailable", gpu=i, error=str(exc))
        self._gpus = gpus
        self._by_pci = {g.identity.pci_bus_id: g.identity.uuid for g in gpus}
        self._by_handle = {_handle_key(g.handle): g.identity.uuid for g in gpus}
        system = _Gpu(
            -1, None, GpuIdentity(index=0, uuid="-", model="", pci_bus_id=""), None, None, ()
        )
        driver = self._opt(system, "driver", n.nvmlSystemGetDriverVersion)
        cuda = self._opt(system, "cuda", n.nvmlSystemGetCudaDriverVersion)
        cuda_s = None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        return Inventory(
            source="nvml",
            gpus=tuple(g.identity for g in gpus),
            driver_version=None if driver is None else str(driver),
            cuda_version=cuda_s,
        )

    def _open(self, i: int) -> _Gpu:
        """One GPU's identity and static facts (system thread)."""
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(i)
        pci = n.nvmlDeviceGetPciInfo_v3(h).busId
        pci = pci.decode() if isinstance(pci, bytes) else str(pci)
        scratch = _Gpu(i, h, GpuIdentity(index=i, uuid="", model="", pci_bus_id=""), None, None, ())
        mig = self._opt(scratch, "mig", n.nvmlDeviceGetMigMode, h)
        mem = self._opt(scratch, "mem", n.nvmlDeviceGetMemoryInfo, h)
        ident = GpuIdentity(
            index=i,
            uuid=str(n.nvmlDeviceGetUUID(h)),
            model=str(n.nvmlDeviceGetName(h)),
            pci_bus_id=pci.upper(),
            serial=self._opt(scratch, "serial", n.nvmlDeviceGetSerial, h),
            memory_total_bytes=None if mem is None else int(mem.total),
            mig_enabled=bool(mig and mig[0] == 1),
        )
        th = n.nvmlDeviceGetTemperatureThreshold
        slow = self._opt(scratch, "t_slow", th, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shut = self._opt(scratch, "t_shut", th, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        links = []
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError:
                break
            links.append(link)
        return _Gpu(i, h, ident, _f(slow), _f(shut), tuple(links))

    # ----------------------------------------------------------------- polling

    async def _poll(self, g: _Gpu) -> list[Any]:
        now = self._clock.now()
        uuid = g.identity.uuid
        if g.pending is not None and not g.pending.done():
            return [
                LivenessObservation(
                    source="nvml",
                    kind="unresponsive",
                    at=now,
                    uuid=uuid,
                    detail="an earlier NVML call has not returned",
                )
            ]
        assert g.executor is not None
        fut = g.executor.submit(lambda: self._read(g))
        g.pending = None
        try:
            smp = await asyncio.wait_for(_shielded(fut), self.settings.call_deadline_s)
        except TimeoutError:
            g.pending = fut
            g.unhealthy = True
            self.call_timeouts_total[g.index] = self.call_timeouts_total.get(g.index, 0) + 1
            log.warning("nvml_call_timeout", gpu=g.index, deadline_s=self.settings.call_deadline_s)
            return [
                LivenessObservation(
                    source="nvml",
                    kind="unresponsive",
                    at=now,
                    uuid=uuid,
                    detail=f"NVML did not answer within {self.settings.call_deadline_s:g} s",
                )
            ]
        except _Lost as exc:
            g.unhealthy = True
            return [
                LivenessObservation(source="nvml", kind="lost", at=now, uuid=uuid, detail=str(exc))
            ]
        out: list[Any] = []
        if g.unhealthy:
            g.unhealthy = False
            out.append(LivenessObservation(source="nvml", kind="responsive", at=now, uuid=uuid))
        out.append(smp)
        return out

    def _opt(self, g: _Gpu, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """One NVML call: NOT_SUPPORTED -> None (and not asked again), GPU_IS_LOST -> _Lost."""
        if key in g.unsupported:
            return None
        n = self._nvml
        try:
            return fn(*args)
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == n.NVML_ERROR_GPU_IS_LOST:
                raise _Lost(f"NVML: GPU is lost ({key})") from exc
            if code in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND):
                g.unsupported.add(key)
            elif code not in (n.NVML_ERROR_NOT_FOUND, n.NVML_SUCCESS):
                # NOT_FOUND: nothing to report (no process samples, empty MIG slot);
                # SUCCESS: pynvml raises it for "zero process samples".
                self.field_errors_total += 1
            return None

    def _read(self, g: _Gpu) -> GpuSample:
        """One GPU's sample (runs in that GPU's worker thread)."""
        n, h, opt = self._nvml, g.handle, self._opt
        temp = opt(g, "temp", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        fv = opt(g, "memtemp", n.nvmlDeviceGetFieldValues, h, [n.NVML_FI_DEV_MEMORY_TEMP])
        mem_temp = None
        if fv and fv[0].nvmlReturn == n.NVML_SUCCESS:
            mem_temp = float(fv[0].value.uiVal)
        elif fv is not None:
            g.unsupported.add("memtemp")
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
        mig = opt(g, "mig", n.nvmlDeviceGetMigMode, h)
        mig_on = bool(mig and mig[0] == 1)
        if self.polls_total % max(1, self.settings.nvlink_every_polls) == 0:
            g.nvlink_cache = self._nvlink(g)
        links_up, links_total, nvl_err = g.nvlink_cache
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
            mig_instances=self._mig_instances(g) if mig_on else (None if mig is None else 0),
            process_utilization=self._process_util(g) if self.settings.process_utilization else {},
        )

    def _nvlink(self, g: _Gpu) -> tuple[int | None, int | None, int | None]:
        if not g.links:
            return (None, None, None)
        n, h = self._nvml, g.handle
        up = errors = 0
        for link in g.links:
            if self._opt(g, "nvlink", n.nvmlDeviceGetNvLinkState, h, link):
                up += 1
                for counter in _NVLINK_COUNTERS:
                    v = self._opt(
                        g, "nvlink_err", n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter
                    )
                    errors += v or 0
        err = None if "nvlink_err" in g.unsupported else errors
        return (up, len(g.links), err)

    def _mig_instances(self, g: _Gpu) -> int | None:
        n = self._nvml
        top = self._opt(g, "mig_max", n.nvmlDeviceGetMaxMigDeviceCount, g.handle)
        if top is None:
            return None
        return sum(
            1
            for i in range(int(top))
            if self._opt(g, "mig_dev", n.nvmlDeviceGetMigDeviceHandleByIndex, g.handle, i)
            is not None
        )

    def _process_util(self, g: _Gpu) -> dict[int, float]:
        samples = self._opt(
            g, "proc_util", self._nvml.nvmlDeviceGetProcessUtilization, g.handle, g.process_ts
        )
        if not samples:
            return {}
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = min(1.0, max(0.0, s.smUtil / 100.0))
            g.process_ts = max(g.process_ts, int(s.timeStamp))
        return out

    # ----------------------------------------------------------------- events (own thread)

    def _wait_events(
        self, loop: asyncio.AbstractEventLoop, sink: ObservationSink, stop: threading.Event
    ) -> None:
        n = self._nvml
        xid_t, dbe_t = n.nvmlEventTypeXidCriticalError, n.nvmlEventTypeDoubleBitEccError
        try:
            es = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("nvml_events_unavailable", error=str(exc))
            return
        try:
            for g in self._gpus:
                try:
                    mask = n.nvmlDeviceGetSupportedEventTypes(g.handle) & (xid_t | dbe_t)
                    if mask:
                        n.nvmlDeviceRegisterEvents(g.handle, mask, es)
                except n.NVMLError as exc:
                    log.warning("nvml_event_register_failed", gpu=g.index, error=str(exc))
            while not stop.is_set():
                try:
                    data = n.nvmlEventSetWait_v2(es, self.settings.event_wait_ms)
                except n.NVMLError as exc:
                    if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                        log.warning("nvml_event_wait_failed", error=str(exc))
                        stop.wait(self.settings.event_wait_ms / 1000.0)
                    continue
                obs = self._event_obs(data, xid_t, dbe_t)
                if obs is not None:
                    self.events_total += 1
                    with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                        loop.call_soon_threadsafe(sink, obs)
        finally:
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(es)

    def _event_obs(self, data: Any, xid_t: int, dbe_t: int) -> XidObservation | EccEvent | None:
        uuid = self._by_handle.get(_handle_key(data.device))
        if uuid is None:
            return None
        at = self._clock.now()
        if data.eventType & xid_t:
            pci = next((p for p, u in self._by_pci.items() if u == uuid), None)
            return XidObservation(
                source="nvml", xid=int(data.eventData), at=at, uuid=uuid, pci_bus_id=pci
            )
        if data.eventType & dbe_t:
            return EccEvent(source="nvml", uuid=uuid, at=at, double_bit=True)
        return None


def _shielded(fut: Future[T]) -> asyncio.Future[T]:
    """Await a worker's call without cancelling it on timeout; a late result or error of an
    abandoned call is consumed quietly."""
    afut = asyncio.wrap_future(fut)
    afut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return asyncio.shield(afut)


def _handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML device handle (ctypes pointers compare by address)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


@lru_cache(maxsize=256)
def throttle_reason_names(mask: int) -> frozenset[str]:
    """NVML's clocks-event (throttle) bitmask -> reason names (also DCGM's)."""
    return frozenset(name for bit, name in _THROTTLE_BITS if mask & bit)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)
