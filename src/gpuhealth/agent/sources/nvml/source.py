"""NVML source: per-GPU telemetry polls and an XID / ECC event waiter.

The only source that talks to pynvml (tests inject a fake with the same functions). Every NVML
call runs off the event loop: each GPU has its own thread, and one GPU's sample read
(:mod:`gpuhealth.agent.sources.nvml.device`) must finish within ``call_deadline_s``. A read
that passes it marks that GPU unresponsive; the others keep being polled, and the stuck GPU is
not asked again until its hung call returns. GPU_IS_LOST gives a ``lost`` liveness
observation; fewer GPUs than expected, ``missing``. These deadlines (``call_deadline_s``,
``shutdown_deadline_s``) are wall time, not the injected clock's: they bound a driver call
stuck in a thread, which hangs in real time whatever clock schedules the polls.

**Events** (:class:`NvmlEventWaiter`): XID, double-bit ECC and recovery-action events between
polls, waited on in their own thread. The waiter registers every GPU for the event types it
supports, waits ``event_wait_ms`` at a time (so that it notices shutdown), and hands each
event to the event loop as an observation. A recovery-action event, and XID 154 (whose NVML
event carries no message), read the GPU's recovery-action field at once: the verdict then
names the action the driver asks for, whichever source (NVML or the kernel log) reports it
first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.health import recovery_action
from gpuhealth.agent.health.op_event_catalog import driver_release
from gpuhealth.agent.observations import (
    EccObservation,
    GpuIdentity,
    Inventory,
    LivenessObservation,
    Observation,
    ObservationSink,
    OperationalEventObservation,
    PciAddress,
    RecoveryActionObservation,
    SourceName,
    XidObservation,
)
from gpuhealth.agent.sources.call_thread import CallThread, await_call
from gpuhealth.agent.sources.nvml.cper import CPER_COUNTERS, CperReader, CperSeenIds
from gpuhealth.agent.sources.nvml.device import (
    NVML_FIELD_ERRORS,
    NvmlReader,
    handle_key,
    read_recovery_action,
)
from gpuhealth.agent.sources.nvml.gpu import GpuLost, NvmlGpu
from gpuhealth.agent.sources.nvml.operational import (
    NVML_OP_EVENT_ERRORS,
    NVML_OP_EVENTS,
    OperationalEventWaiter,
)
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")
T = TypeVar("T")

NVML_CALL_TIMEOUTS = CounterSpec(
    "nvml_call_timeouts", "NVML sample reads that passed their deadline.", label="gpu"
)
NVML_SHUTDOWN_TIMEOUTS = CounterSpec(
    "nvml_shutdown_timeouts",
    "Stops at which the NVML threads and nvmlShutdown passed nvml.shutdown_deadline_s.",
)


def nvml_library() -> Any:
    """The NVML bindings (``pynvml`` of nvidia-ml-py): for this source, and for the
    remediation executors' NVML questions (``gpuhealth.agent.remediation.nvml_probe``, worker
    threads)."""
    import pynvml

    return pynvml


class NvmlSource:
    """A :class:`~gpuhealth.agent.sources.base.Source` reading GPUs through NVML."""

    name: SourceName = "nvml"

    def __init__(
        self,
        settings: NvmlSettings,
        clock: Clock,
        nvml_module: Any = None,
        *,
        state: StateStore | str | Path | None = None,
        boot_id: str = "",
    ) -> None:
        """``state`` (the state store or its dir; None: memory only) / ``boot_id``: where the
        CPER records already handled are kept, per boot."""
        self._nvml = nvml_module if nvml_module is not None else nvml_library()
        self.settings = settings
        self._clock = clock
        self.counters = Counters(
            NVML_CALL_TIMEOUTS,
            NVML_FIELD_ERRORS,
            NVML_EVENTS,
            NVML_SHUTDOWN_TIMEOUTS,
            NVML_OP_EVENTS,
            NVML_OP_EVENT_ERRORS,
            *CPER_COUNTERS,
        )
        self._cper_seen = CperSeenIds(state, boot_id)
        self._op: OperationalEventWaiter | None = None
        self._op_thread: threading.Thread | None = None
        self.polls = Histogram()
        self.errors = 0
        self.up = False
        self._reader = NvmlReader(
            self._nvml,
            clock,
            self.counters,
            process_utilization=settings.process_utilization,
            mig_recheck_s=settings.mig_recheck_s,
        )
        self._gpus: list[NvmlGpu] = []
        self._system: CallThread | None = None
        self._events: threading.Thread | None = None
        self._initialized = False
        """nvmlInit returned (so nvmlShutdown is due at stop)."""
        self._system_hung = False
        """A system-thread call passed its deadline and has not returned."""
        self._counted = 0
        self.last_poll_duration_s = 0.0
        self.inventory: Inventory | None = None

    @property
    def ready(self) -> bool:
        """The inventory is known."""
        return self.inventory is not None

    def event_paths(self) -> dict[str, bool]:
        """Which of NVML's event paths run: the Xid event set, GPU Operational Events."""
        events = self._events is not None and self._events.is_alive()
        return {"nvml_xid": events, "operational_events": bool(self._op and self._op.active)}

    # ----------------------------------------------------------------- lifecycle

    async def run(self, sink: ObservationSink) -> None:
        loop = asyncio.get_running_loop()
        self._system = CallThread("nvml-system")
        self._events = None
        self._initialized = self._system_hung = False
        stop = threading.Event()
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
                g.thread = CallThread(f"nvml-gpu{g.index}")
            waiter = NvmlEventWaiter(
                self._nvml,
                self._clock,
                self.counters,
                self._gpus,
                wait_ms=self.settings.event_wait_ms,
            )
            events = threading.Thread(
                target=waiter.run, args=(loop, sink, stop), name="nvml-events", daemon=True
            )
            events.start()
            self._events = events
            await self._operational(loop, sink, stop)
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
                            expected=expected,
                            visible=present,
                        )
                    )
                self.up = True
                self.last_poll_duration_s = time.perf_counter() - started
                self.polls.observe(self.last_poll_duration_s)
                await self._clock.sleep(
                    max(0.0, self.settings.poll_interval_s - self.last_poll_duration_s)
                )
        except BaseException:
            self.up = False
            raise
        finally:
            stop.set()
            await self._shutdown()

    async def _shutdown(self) -> None:
        """Stop the threads and call nvmlShutdown in the system thread, waiting at most
        ``shutdown_deadline_s``: a hung NVML call must not hold up the agent's stop."""
        assert self._system is not None
        deadline = self.settings.shutdown_deadline_s
        for g in self._gpus:
            if g.thread is not None:
                g.thread.stop()
        if not self._initialized or self._system_hung:
            self._system.stop()  # nothing to shut down, or the thread is stuck in a call
            return
        fut = self._system.submit(lambda: self._finish_nvml(time.monotonic() + deadline))
        self._system.stop()
        try:
            outcome = await asyncio.wait_for(await_call(fut), deadline)
        except TimeoutError:
            self.counters.inc(NVML_SHUTDOWN_TIMEOUTS)
            log.warning("nvml_shutdown_timeout", deadline_s=deadline)
            return
        except Exception as exc:  # nvmlShutdown failed: nothing left to do at stop
            log.warning("nvml_shutdown_failed", error=str(exc))
            return
        if outcome:
            log.warning("nvml_shutdown_skipped", reason=outcome)

    def _finish_nvml(self, until: float) -> str:
        """In the system thread: wait for the GPU and event threads, then nvmlShutdown.
        Returns why it was skipped ("" when it ran)."""
        busy = [g.index for g in self._gpus if g.pending is not None and not g.pending.done()]
        if busy:
            return f"NVML calls on GPUs {busy} have not returned"
        for g in self._gpus:
            if g.thread is not None and not g.thread.join(until - time.monotonic()):
                return f"GPU {g.index}'s NVML thread did not finish"
        for thread in (self._events, self._op_thread):
            if thread is not None:
                thread.join(max(0.0, until - time.monotonic()))
                if thread.is_alive():
                    return f"the NVML event waiter {thread.name} did not finish"
        self._nvml.nvmlShutdown()
        return ""

    async def _operational(
        self, loop: asyncio.AbstractEventLoop, sink: ObservationSink, stop: threading.Event
    ) -> None:
        """The operational-event waiter, which reads the CPER log back right after it
        registered (each where the driver has it); without the waiter the read-back runs here.
        Detected at every start of the source: after a driver reload the source restarts."""
        s = self.settings
        self._op, self._op_thread = None, None
        inv = self.inventory
        reader = CperReader(
            self._nvml,
            self.counters,
            self._cper_seen,
            self._clock.now,
            driver=driver_release(inv.driver_version if inv else None),
        )
        if not s.operational_events:
            if s.cper_replay:  # no live path: nothing can fall between read and registration
                try:
                    replayed = await self._call(
                        lambda: reader.replay(self._gpus),
                        s.init_deadline_s,
                        "nvmlSystemGetCPER_v1",
                    )
                except TransientError as exc:
                    log.warning("nvml_cper_replay_failed", error=str(exc))
                    replayed = []
                self._cper_seen.hand_on(sink, replayed)
            return

        def hand_on(obs: Observation) -> None:
            """On the loop (the waiter's ``call_soon_threadsafe``): sink, then seen."""
            assert isinstance(obs, OperationalEventObservation)
            self._cper_seen.hand_on(sink, (obs,))

        def read_back() -> None:
            """In the waiter's thread, after it registered: the records not handled yet, handed
            on the loop (each record's sections together, then its id remembered)."""
            try:
                replayed = reader.replay(self._gpus)
            except Exception as exc:  # a read-back bug must never stop the live events
                log.error("nvml_cper_replay_failed", error=repr(exc))
                return
            if replayed:
                with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                    loop.call_soon_threadsafe(self._cper_seen.hand_on, sink, replayed)

        op = OperationalEventWaiter(
            self._nvml,
            self._clock,
            self.counters,
            self._gpus,
            wait_ms=s.event_wait_ms,
            recheck_s=s.operational_events_recheck_s,
            read_back=read_back if s.cper_replay else None,
        )
        self._op = op
        thread = threading.Thread(
            target=op.run, args=(loop, hand_on, stop), name="nvml-operational-events", daemon=True
        )
        thread.start()
        self._op_thread = thread

    async def _call(self, fn: Callable[[], T], deadline: float, what: str) -> T:
        assert self._system is not None
        fut = self._system.submit(fn)
        try:
            return await asyncio.wait_for(await_call(fut), deadline)
        except TimeoutError as exc:
            self._system_hung = True
            raise TransientError(f"NVML {what} did not return within {deadline:g} s") from exc
        except self._nvml.NVMLError as exc:
            raise TransientError(f"NVML {what}: {exc}") from exc

    def _missing(self, count: int, expected: int) -> LivenessObservation:
        return LivenessObservation(
            source="nvml",
            kind="missing",
            at=self._clock.now(),
            detail=f"{count} of {expected} expected GPUs visible",
            expected=expected,
            visible=count,
        )

    # ----------------------------------------------------------------- inventory (system thread)

    def _init(self) -> Inventory:
        n = self._nvml
        n.nvmlInit()
        self._initialized = True
        gpus: list[NvmlGpu] = []
        self._counted = int(n.nvmlDeviceGetCount())
        for i in range(self._counted):
            try:
                gpus.append(self._reader.open(i))
            except (n.NVMLError, GpuLost) as exc:  # one broken GPU must not hide the others
                log.error("nvml_gpu_unavailable", gpu=i, error=str(exc))
        self._gpus = gpus
        blank = GpuIdentity(index=0, uuid="-", model="", pci_bus_id="")
        system = NvmlGpu(-1, None, blank, None, None, ())
        driver = self._reader.opt(system, "driver", n.nvmlSystemGetDriverVersion)
        cuda = self._reader.opt(system, "cuda", n.nvmlSystemGetCudaDriverVersion)
        cuda_s = None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        return Inventory(
            source="nvml",
            gpus=tuple(g.identity for g in gpus),
            driver_version=None if driver is None else str(driver),
            cuda_version=cuda_s,
        )

    # ----------------------------------------------------------------- polling

    async def _poll(self, g: NvmlGpu) -> list[Observation]:
        now = self._clock.now()
        uuid = g.identity.uuid
        deadline = self.settings.call_deadline_s
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
        assert g.thread is not None
        nvlink = self.polls.count % self.settings.nvlink_every_polls == 0
        fut = g.thread.submit(lambda: self._reader.read(g, nvlink=nvlink))
        g.pending = None
        try:
            smp = await asyncio.wait_for(await_call(fut), deadline)
        except TimeoutError:
            g.pending = fut
            g.unhealthy = True
            self.counters.inc(NVML_CALL_TIMEOUTS, label=str(g.index))
            log.warning("nvml_call_timeout", gpu=g.index, deadline_s=deadline)
            return [
                LivenessObservation(
                    source="nvml",
                    kind="unresponsive",
                    at=now,
                    uuid=uuid,
                    detail=f"NVML did not answer within {deadline:g} s",
                )
            ]
        except GpuLost as exc:
            g.unhealthy = True
            return [
                LivenessObservation(source="nvml", kind="lost", at=now, uuid=uuid, detail=str(exc))
            ]
        out: list[Observation] = []
        if g.unhealthy:
            g.unhealthy = False
            out.append(LivenessObservation(source="nvml", kind="responsive", at=now, uuid=uuid))
        out.append(smp)
        return out


log = get_logger("nvml")

NVML_EVENTS = CounterSpec(
    "nvml_events", "XID, ECC and recovery-action events received from NVML's event set."
)
XID_RECOVERY_CHANGED = 154
EventObservation = XidObservation | EccObservation | RecoveryActionObservation


class NvmlEventWaiter:
    def __init__(
        self,
        nvml: Any,
        clock: Clock,
        counters: Counters,
        gpus: Sequence[NvmlGpu],
        *,
        wait_ms: int,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._counters = counters
        self._gpus = gpus
        self._wait_ms = wait_ms
        self._by_handle: Mapping[Any, NvmlGpu] = {handle_key(g.handle): g for g in gpus}

    def run(
        self, loop: asyncio.AbstractEventLoop, sink: ObservationSink, stop: threading.Event
    ) -> None:
        """Wait for events until ``stop`` is set (the body of the waiter thread)."""
        n = self._nvml
        xid_t, dbe_t = n.nvmlEventTypeXidCriticalError, n.nvmlEventTypeDoubleBitEccError
        rec_t = getattr(n, "nvmlEventTypeGpuRecoveryAction", recovery_action.EVENT_TYPE)
        try:
            es = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("nvml_events_unavailable", error=str(exc))
            return
        try:
            for g in self._gpus:
                try:
                    mask = n.nvmlDeviceGetSupportedEventTypes(g.handle) & (xid_t | dbe_t | rec_t)
                    if mask:
                        n.nvmlDeviceRegisterEvents(g.handle, mask, es)
                except n.NVMLError as exc:
                    log.warning("nvml_event_register_failed", gpu=g.index, error=str(exc))
            while not stop.is_set():
                try:
                    data = n.nvmlEventSetWait_v2(es, self._wait_ms)
                except n.NVMLError as exc:
                    if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                        log.warning("nvml_event_wait_failed", error=str(exc))
                        stop.wait(self._wait_ms / 1000.0)
                    continue
                obs = self.observation(data, xid_t, dbe_t, rec_t)
                if obs is not None:
                    self._counters.inc(NVML_EVENTS)
                    with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                        loop.call_soon_threadsafe(sink, obs)
        finally:
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(es)

    def observation(
        self, data: Any, xid_t: int, dbe_t: int, rec_t: int = recovery_action.EVENT_TYPE
    ) -> EventObservation | None:
        g = self._by_handle.get(handle_key(data.device))
        if g is None:
            return None
        uuid = g.identity.uuid
        at = self._clock.now()
        if data.eventType & xid_t:
            xid = int(data.eventData)
            message = ""
            if xid == XID_RECOVERY_CHANGED:
                value = read_recovery_action(self._nvml, g.handle)
                message = "" if value is None else recovery_action.describe(value)
            return XidObservation(
                source="nvml",
                xid=xid,
                at=at,
                uuid=uuid,
                pci=PciAddress.parse(g.identity.pci_bus_id),
                message=message,
            )
        if data.eventType & dbe_t:
            return EccObservation(source="nvml", uuid=uuid, at=at, double_bit=True)
        if data.eventType & rec_t:
            value = read_recovery_action(self._nvml, g.handle)
            if value is None:
                value = int(data.eventData)  # the field could not be read: the event's own
            return RecoveryActionObservation(source="nvml", uuid=uuid, at=at, value=value)
        return None
