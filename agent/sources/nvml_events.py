"""NVML's event set: XID and double-bit ECC events between polls, waited on in their own thread.

The waiter registers every GPU for the event types it supports, waits ``event_wait_ms`` at a
time (so that it notices shutdown), and hands each event to the event loop as an observation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.observations import EccEvent, ObservationSink, XidObservation
from gpuhealth.agent.sources.nvml_device import NvmlGpu, handle_key
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")

NVML_EVENTS = CounterSpec("nvml_events", "XID and ECC events received from NVML's event set.")


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
                    data = n.nvmlEventSetWait_v2(es, self._wait_ms)
                except n.NVMLError as exc:
                    if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                        log.warning("nvml_event_wait_failed", error=str(exc))
                        stop.wait(self._wait_ms / 1000.0)
                    continue
                obs = self.observation(data, xid_t, dbe_t)
                if obs is not None:
                    self._counters.inc(NVML_EVENTS)
                    with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                        loop.call_soon_threadsafe(sink, obs)
        finally:
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(es)

    def observation(self, data: Any, xid_t: int, dbe_t: int) -> XidObservation | EccEvent | None:
        g = self._by_handle.get(handle_key(data.device))
        if g is None:
            return None
        uuid = g.identity.uuid
        at = self._clock.now()
        if data.eventType & xid_t:
            return XidObservation(
                source="nvml",
                xid=int(data.eventData),
                at=at,
                uuid=uuid,
                pci_bus_id=g.identity.pci_bus_id,
            )
        if data.eventType & dbe_t:
            return EccEvent(source="nvml", uuid=uuid, at=at, double_bit=True)
        return None
