"""Drives the health engine and delivers what follows from each change.

Every way into the engine goes through here: the sources' observations (:meth:`observe`, their
sink), the tick loop's time-based changes (:meth:`tick`), an operator's clear (:meth:`clear`)
and the verdicts restored at start (:meth:`restore_latched`). After each, the node snapshot is
marked stale, the transitions go to the listeners (inline: the stream client's ``publish``
appends to its durable outbox right there) and, when verdicts changed, the latched ones are
saved for a restart on the same boot.

Synchronous: a kernel-log XID reaches the engine, the snapshot and the outbox before the
follower reads its next line. Each call is one transaction of the state store: what it writes
(the outbox Events, the latched verdicts, the kernel-log position past the XID's line) commits
together, or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.health import HealthEngine
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.observations import GpuSample, Observation
from gpuhealth.agent.state_store import LatchedStore
from gpuhealth.common.errors import PermanentError
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import GpuStatus

log = get_logger("agent")

VERDICTS_CLEARED = CounterSpec(
    "verdicts_cleared",
    "GPU verdicts cleared by an operator (gpuhealth-agent clear), one per GPU that had any.",
)


ALL_GPUS = "all"


class UnknownGpuError(PermanentError):
    """The operator named a GPU this agent does not know."""


class ClearedGpu(msgspec.Struct, kw_only=True):
    """One GPU an operator clear went over."""

    index: int
    uuid: str
    previous: str
    current: str
    conditions: list[str]
    """Codes of the conditions that were cleared (empty: there was nothing to clear)."""


def select_gpus(selector: str, statuses: Sequence[GpuStatus]) -> list[GpuStatus]:
    """The GPUs ``selector`` names: ``all``, an index, or a UUID (any case)."""
    want = selector.strip()
    if not want:
        raise UnknownGpuError("no GPU given: use a UUID, an index or 'all'")
    if want.lower() == ALL_GPUS:
        return list(statuses)
    if want.isdigit():
        hits = [s for s in statuses if s.info.index == int(want)]
    else:
        hits = [s for s in statuses if s.info.uuid.lower() == want.lower()]
    if not hits:
        known = ", ".join(f"{s.info.index}={s.info.uuid}" for s in statuses) or "none"
        raise UnknownGpuError(f"no GPU {want!r} on this node (known: {known})")
    return hits


class SnapshotInvalidation(Protocol):
    """The node snapshot cache (:class:`~gpuhealth.agent.node_snapshot.NodeSnapshotCache`)."""

    def mark_dirty(self) -> None: ...
    def note_sample(self) -> None: ...


TransitionListener = Callable[[Transition], None]
"""Called inline with every transition; it must not block (the stream client's ``publish``)."""
NodeListener = Callable[[], None]
"""Called when the node's own state changes (its node-level conditions, a GPU's MIG devices):
no GPU transition carries those, so the stream client queues a Snapshot."""


class UsageRecorder(Protocol):
    """Utilisation between heartbeats (:class:`~gpuhealth.agent.usage.UsageAccumulator`)."""

    def record(self, sample: GpuSample) -> None: ...


class EngineDriver:
    def __init__(
        self,
        engine: HealthEngine,
        snapshot: SnapshotInvalidation,
        latched: LatchedStore,
        usage: UsageRecorder,
    ) -> None:
        """When the node's own conditions, a GPU's MIG devices or its NIC ports change (no GPU
        transition carries them) the node listeners are told (the stream client sends a fresh
        Snapshot)."""
        self.engine = engine
        self._snapshot = snapshot
        self._listeners: list[TransitionListener] = []
        self._node_listeners: list[NodeListener] = []
        self._latched = latched
        self._usage = usage
        self._node_version = engine.node_version
        self._devices_version = engine.devices_version
        self._nics_version = engine.nics_version
        self.counters = Counters(VERDICTS_CLEARED)

    def add_listener(
        self, on_transition: TransitionListener, on_node_change: NodeListener | None = None
    ) -> None:
        """Tell ``on_transition`` every transition, and ``on_node_change`` every change of the
        node's own state (the stream client, which wiring adds when there is a controller)."""
        self._listeners.append(on_transition)
        if on_node_change is not None:
            self._node_listeners.append(on_node_change)

    def observe(self, obs: Observation) -> None:
        """The sink every source writes to."""
        with self._latched.store.transaction():
            transitions = self.engine.observe(obs)
            if isinstance(obs, GpuSample):
                self._usage.record(obs)
                self._snapshot.note_sample()
            self._deliver(transitions)
            self._confirm_taken()

    def tick(self) -> None:
        with self._latched.store.transaction():
            self._deliver(self.engine.tick())
            self._confirm_taken()

    def _confirm_taken(self) -> None:
        """Tell each XID's source that the engine took it (after its transitions reached the
        outbox and the latched verdicts were saved): the kernel-log follower saves its
        position past the line only now."""
        for xid in self.engine.taken():
            if xid.on_taken is not None:
                xid.on_taken()

    def _deliver(self, transitions: Sequence[Transition]) -> None:
        self._snapshot.mark_dirty()
        if transitions:
            self._publish(transitions)
            self._latched.save(self.engine.latched())
        if self.engine.node_version != self._node_version:
            self._node_version = self.engine.node_version
            conditions = self.engine.node_conditions()
            (log.warning if conditions else log.info)(
                "node_conditions_changed",
                conditions=[f"{c.code}: {c.message}" for c in conditions],
            )
            self._node_changed()
        if self.engine.devices_version != self._devices_version:
            self._devices_version = self.engine.devices_version
            log.info(
                "gpu_devices_changed", mig_devices=sum(map(len, self.engine.mig_devices().values()))
            )
            self._node_changed()
        if self.engine.nics_version != self._nics_version:
            self._nics_version = self.engine.nics_version
            ports = self.engine.nic_ports()
            log.info(
                "nic_ports_changed",
                ports=[
                    f"{p.sample.device}/{p.sample.port} {p.sample.port_state}/{p.sample.phys_state}"
                    + "".join(f" {c.code}" for c in p.verdicts)
                    for p in ports
                ],
            )
            self._node_changed()

    def _publish(self, transitions: Sequence[Transition]) -> None:
        for t in transitions:
            for listener in self._listeners:
                try:
                    listener(t)
                except Exception:
                    # One broken listener must not stop the engine or the other listeners.
                    log.exception("transition_listener_failed", uuid=t.uuid, kind=t.kind)

    def _node_changed(self) -> None:
        for listener in self._node_listeners:
            try:
                listener()
            except Exception:
                log.exception("node_listener_failed")

    def restore_latched(self) -> None:
        """Re-raise the XID/ECC verdicts saved before a restart on this boot."""
        restored = self._latched.load()
        if restored:
            log.info("latched_verdicts_restored", gpus=len(restored))
            with self._latched.store.transaction():
                self._deliver(self.engine.restore_latched(restored))

    def clear(self, gpu: str, reason: str, operator: str) -> list[ClearedGpu]:
        """Operator clear (``gpuhealth-agent clear``): through the engine, so the transitions
        reach the stream and the controller untaints as usual; the latched file is rewritten
        so that a restart does not bring the verdict back."""
        with self._latched.store.transaction():
            return self._clear(gpu, reason, operator)

    def _clear(self, gpu: str, reason: str, operator: str) -> list[ClearedGpu]:
        cleared: list[ClearedGpu] = []
        for st in select_gpus(gpu, self.engine.statuses()):
            transitions = self.engine.clear(st.info.uuid)
            self._deliver(transitions)
            current = transitions[-1].current if transitions else st.state
            codes = [c.code for c in st.conditions]
            cleared.append(
                ClearedGpu(
                    index=st.info.index,
                    uuid=st.info.uuid,
                    previous=st.state,
                    current=current,
                    conditions=codes,
                )
            )
            if not codes:
                log.info("verdict_clear_nothing_to_clear", gpu=st.info.index, uuid=st.info.uuid)
                continue
            self.counters.inc(VERDICTS_CLEARED)
            log.info(
                "verdict_cleared",
                gpu=st.info.index,
                uuid=st.info.uuid,
                previous=st.state,
                current=current,
                conditions=codes,
                reason=reason,
                operator=operator,
            )
        self._latched.save(self.engine.latched())
        return cleared
