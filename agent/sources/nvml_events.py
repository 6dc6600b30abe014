"""NVML's event set: XID, double-bit ECC and recovery-action events between polls, waited on
in their own thread.

The waiter registers every GPU for the event types it supports, waits ``event_wait_ms`` at a
time (so that it notices shutdown), and hands each event to the event loop as an observation.
A recovery-action event, and XID 154 (whose NVML event carries no message), read the GPU's
recovery-action field at once: the verdict then names the action the driver asks for,
whichever source (NVML or the kernel log) reports it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.health import recovery_action
from gpuhealth.agent.observations import (
    EccEvent,
    ObservationSink,
    PciAddress,
    RecoveryActionObservation,
    XidObservation,
)
from gpuhealth.agent.sources.nvml_device import NvmlGpu
from gpuhealth.agent.sources.nvml_fields import read_recovery_action
from gpuhealth.agent.sources.nvml_threads import handle_key
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")

NVML_EVENTS = CounterSpec(
    "nvml_events", "XID, ECC and recovery-action events received from NVML's event set."
)
XID_RECOVERY_CHANGED = 154
EventObservation = XidObservation | EccEvent | RecoveryActionObservation


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
            return EccEvent(source="nvml", uuid=uuid, at=at, double_bit=True)
        if data.eventType & rec_t:
            value = read_recovery_action(self._nvml, g.handle)
            if value is None:
                value = int(data.eventData)  # the field could not be read: the event's own
            return RecoveryActionObservation(source="nvml", uuid=uuid, at=at, value=value)
        return None
