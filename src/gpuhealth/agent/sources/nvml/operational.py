"""GPU Operational Events from NVML (drivers R615+, preview), waited on in their own thread.

Capability is detected each time the NVML source starts (after nvmlInit: at the agent's start
and after every restart of the source, as after a driver reload): the waiter creates its own
event set and registers each GPU with ``nvmlEventSetRegisterGpuOperationalEvents_v1``. Bindings
without the function, or a driver answering ``NVML_ERROR_FUNCTION_NOT_FOUND`` /
``NVML_ERROR_NOT_SUPPORTED`` (every driver before R615), leave the path off: the legacy paths
(NVML's Xid event, the kernel log, dcgm-exporter) simply continue, and
``gpuhealth_agent_event_paths{path="operational_events"}`` says 0.

Each ``nvmlEventSetWait_v3`` record of data type GPU operational event becomes an
:class:`~gpuhealth.agent.observations.OperationalEventObservation`; its legacy Xid (where the
event carries one) is read from the event's contexts
(``nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1``). The health engine judges it
(:mod:`gpuhealth.agent.health.op_event_catalog`) and counts it once with its legacy Xid. The
event's group cursor (= its CPER record id) is remembered
(:mod:`gpuhealth.agent.sources.nvml.cper`) so that the CPER read-back after a restart does not
report it again.

**Register, then read back.** Right after each registration the waiter runs the CPER
read-back (``read_back``, in its own thread, before its first wait): a fault after the
registration is both delivered and in the CPER log (counted once: by record id, and by group
cursor in the engine), and a fault before it is in the log. Reading the log first would miss a
fault that came between the read and the registration until the next restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.observations import ObservationSink, OperationalEventObservation
from gpuhealth.agent.sources.nvml.gpu import NvmlGpu
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")

NVML_OP_EVENTS = CounterSpec(
    "nvml_operational_events",
    "GPU Operational Events received from NVML's event set (nvmlEventSetWait_v3).",
)
NVML_OP_EVENT_ERRORS = CounterSpec(
    "nvml_operational_event_errors",
    "nvmlEventSetWait_v3 or context reads that failed (other than a timeout).",
)
REGISTER = "nvmlEventSetRegisterGpuOperationalEvents_v1"
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_NOT_SUPPORTED = 3
ERROR_TIMEOUT = 10
DATA_TYPE_GPU_OPERATIONAL_EVENT = 1
CONTEXT_TYPE_LEGACY_XID = 1
REREGISTER_AFTER = 5
"""Failed waits in a row after which the event set is made anew (a reloaded driver)."""


def text(value: Any) -> str:
    """A ctypes char array as pynvml hands it (str, or bytes not NUL-terminated)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).split(b"\0", 1)[0].decode("ascii", "replace")
    return str(value).split("\0", 1)[0]


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class OperationalEventWaiter:
    """Registers every GPU for operational events and waits for them (in its own thread)."""

    def __init__(
        self,
        nvml: Any,
        clock: Clock,
        counters: Counters,
        gpus: Sequence[NvmlGpu],
        *,
        wait_ms: int,
        recheck_s: float = 300.0,
        read_back: Callable[[], None] | None = None,
    ) -> None:
        """``recheck_s``: how often a path found off is asked again (a driver reload or
        upgrade), and how long after the last of ``REREGISTER_AFTER`` failed waits in a row
        the event set is made anew. ``read_back``: the CPER read-back, run in the waiter's
        thread at its start (after the registration, whether the path is on or off) and after
        every later registration that put the path on."""
        self._nvml = nvml
        self._read_back = read_back
        self._clock = clock
        self._counters = counters
        self._gpus = gpus
        self._wait_ms = wait_ms
        self._recheck_s = recheck_s
        self._failures = 0
        self._by_uuid: Mapping[str, NvmlGpu] = {g.identity.uuid: g for g in gpus}
        self.active = False
        """At least one GPU is registered and the waiter runs."""
        self.unavailable: str = "not started"
        """Why the path is off ("" while active)."""

    # ----------------------------------------------------------------- capability

    def register(self) -> Any | None:
        """Create an event set and register every GPU; the set, or None where the driver
        (or the bindings) do not offer operational events."""
        n = self._nvml
        fn = getattr(n, REGISTER, None)
        config_t = getattr(n, "c_nvmlGpuOperationalEventConfig_v1_t", None)
        if fn is None or config_t is None or not hasattr(n, "nvmlEventSetWait_v3"):
            self._off("the NVML bindings have no operational events")
            return None
        try:
            es = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            self._off(f"nvmlEventSetCreate: {exc}")
            return None
        registered = 0
        why = ""
        for g in self._gpus:
            cfg = config_t(
                uuid=g.identity.uuid,
                minLogLevel=getattr(n, "NVML_GPU_OPERATIONAL_EVENT_LOG_LEVEL_ALL", 0),
                minSeverity=getattr(n, "NVML_OPERATIONAL_EVENT_SEVERITY_ALL", 0),
            )
            try:
                fn(es, cfg)
                registered += 1
            except n.NVMLError as exc:
                code = _code(exc)
                if code in (ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_SUPPORTED):
                    why = f"the driver answers {exc} (older than R615)"
                else:
                    why = f"{REGISTER}: {exc}"
                    log.warning("nvml_operational_register_failed", gpu=g.index, error=str(exc))
        if not registered:
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(es)
            self._off(why or "no GPU")
            return None
        self.active, self.unavailable = True, ""
        log.info("nvml_operational_events_active", gpus=registered)
        return es

    def _off(self, why: str) -> None:
        changed = why != self.unavailable
        self.active, self.unavailable = False, why
        if changed:  # logged when it changes, not at every re-check
            log.info("nvml_operational_events_unavailable", reason=why)

    # ----------------------------------------------------------------- waiting

    def run(
        self, loop: asyncio.AbstractEventLoop, sink: ObservationSink, stop: threading.Event
    ) -> None:
        """Register, read back, then wait for events until ``stop`` is set (the waiter
        thread's body). A path that is off is asked again every ``recheck_s``; an event set
        whose waits keep failing (the driver was reloaded under it) is made anew."""
        first = True
        while not stop.is_set():
            es = self.register()
            if self._read_back is not None and (es is not None or first):
                self._read_back()  # registered first: a fault in between is in both
            first = False
            if es is None:
                stop.wait(self._recheck_s)
                continue
            self._wait_loop(es, loop, sink, stop)
            if not stop.is_set():
                stop.wait(min(self._recheck_s, self._wait_ms / 1000.0 * REREGISTER_AFTER))
        self.active = False
        self.unavailable = "stopped"

    def _wait_loop(
        self,
        es: Any,
        loop: asyncio.AbstractEventLoop,
        sink: ObservationSink,
        stop: threading.Event,
    ) -> None:
        n = self._nvml
        self._failures = 0
        try:
            while not stop.is_set():
                obs = self.wait_one(es)
                if self._failures >= REREGISTER_AFTER:
                    log.warning("nvml_operational_reregister", failures=self._failures)
                    return
                if obs is None:
                    continue
                self._counters.inc(NVML_OP_EVENTS)
                with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                    loop.call_soon_threadsafe(sink, obs)
        finally:
            self.active = False
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(es)

    def wait_one(self, es: Any) -> OperationalEventObservation | None:
        """One ``nvmlEventSetWait_v3``: the event, or None (timeout, an NVML event-bit record,
        an error: counted, then a pause of one wait)."""
        n = self._nvml
        params = n.c_nvmlEventSetWait_v3_t()
        params.timeoutMs = self._wait_ms
        try:
            n.nvmlEventSetWait_v3(es, params)
        except n.NVMLError as exc:
            if _code(exc) != ERROR_TIMEOUT:
                self._failures += 1
                self._counters.inc(NVML_OP_EVENT_ERRORS)
                log.warning("nvml_operational_wait_failed", error=str(exc))
                threading.Event().wait(self._wait_ms / 1000.0)
            return None
        self._failures = 0
        data_type = getattr(
            n, "NVML_EVENT_DATA_TYPE_GPU_OPERATIONAL_EVENT", DATA_TYPE_GPU_OPERATIONAL_EVENT
        )
        if int(params.dataType) != data_type:
            return None
        return self.observation(es, params)

    def observation(self, es: Any, p: Any) -> OperationalEventObservation:
        uuid = text(p.uuid)
        return OperationalEventObservation(
            source="nvml",
            at=self._clock.now(),
            uuid=uuid if uuid in self._by_uuid else (uuid or None),
            module=text(p.sourceModule)[:16],
            code=int(p.moduleEventCode),
            category=int(p.categoryId),
            severity=int(p.severity),
            scope=int(p.scope),
            attributes=int(p.attributes),
            group_attributes=int(p.groupAttributes),
            legacy_xid=self.legacy_xid(es),
            group_cursor=int(p.groupCursor),
            log_level=int(p.logLevel),
            group_last=int(p.groupIndex) + 1 >= int(p.groupSize),
        )

    def legacy_xid(self, es: Any) -> int | None:
        """The legacy Xid context of the event just returned, if it has one."""
        n = self._nvml
        indexes: list[int] = [0]
        count_t = getattr(n, "c_nvmlEventSetGetContextCount_v1_t", None)
        info_t = getattr(n, "c_nvmlEventSetGetContextInfo_v1_t", None)
        if count_t is not None and info_t is not None:
            try:
                count = count_t()
                n.nvmlEventSetGetContextCount_v1(es, count)
                indexes = []
                for i in range(min(int(count.count), 32)):
                    info = info_t()
                    info.index = i
                    n.nvmlEventSetGetContextInfo_v1(es, info)
                    if int(info.nvmlGpuOperationalEventContextType) == CONTEXT_TYPE_LEGACY_XID:
                        indexes.append(i)
            except (n.NVMLError, AttributeError):
                indexes = [0]  # no context listing: ask for a legacy Xid at index 0
        for i in indexes:
            req = n.c_nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1_t()
            req.index = i
            try:
                n.nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1(es, req)
            except (n.NVMLError, AttributeError):
                continue
            if int(req.xidCode):
                return int(req.xidCode)
        return None
