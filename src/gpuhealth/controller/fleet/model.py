"""The fleet model: node -> GPUs -> health, allocations, telemetry, built from agent messages.

The fleet implements :class:`gpuhealth.controller.stream.session.IngestSink`. Everyone else reads it
through
:meth:`Fleet.nodes`, :meth:`Fleet.node`, :meth:`Fleet.node_health` and :meth:`Fleet.gpu`; the
records they return are live objects owned by the fleet and must be treated as read-only.
:meth:`Fleet.subscribe` registers a listener told about every change (the reconciler uses
``health`` and ``connection`` changes; idle detection uses ``usage``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.fleet.health import GPU_MISSING_CODE, GpuHealth, NodeHealth, Reporting
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    Event,
    GpuInfo,
    GpuTelemetry,
    Heartbeat,
    Hello,
    Snapshot,
    worst_state,
)
from gpuhealth.protocol.v1 import GpuFabric, HealthState

log = get_logger("fleet")

ChangeKind = Literal["health", "connection", "allocations", "usage", "removed"]
Listener = Callable[[str, ChangeKind], None]
UsageListener = Callable[[str, Sequence[AllocationUsage]], None]


NOTHING: list[Any] = []
"""The one empty list of every record field with nothing in it (a GPU's conditions and MIG
devices, a node's conditions and allocations): a list each cost 72 bytes and an object the
collector walks, 16 per node of 8 GPUs. Records are replaced, never changed in place."""


T = TypeVar("T")


def _shared(items: list[T]) -> list[T]:
    return items if items else NOTHING


def shared_copy(items: Sequence[T]) -> list[T]:
    """A list of ``items`` of one's own; :data:`NOTHING` when there are none."""
    return list(items) if items else NOTHING


class GpuRecord(msgspec.Struct, gc=False):
    """One GPU of a node's record. Not tracked by the garbage collector (``gc=False``): it
    refers to nothing that refers back, and 8 per node were a sixth of the objects a full
    collection walks at 19,000 nodes."""

    info: GpuInfo
    state: HealthState = "unknown"
    conditions: list[Condition] = msgspec.field(default_factory=lambda: NOTHING)
    telemetry: GpuTelemetry | None = None
    state_since: datetime | None = None
    fabric: GpuFabric | None = None
    """The GPU's NVLink fabric membership and health (its last Snapshot)."""


@dataclass(slots=True)
class NodeRecord:
    name: str
    gpus: dict[str, GpuRecord] = field(default_factory=dict)
    """By GPU UUID."""
    allocations: list[Allocation] = field(default_factory=lambda: NOTHING)
    usage_at: datetime | None = None
    """When the latest heartbeat was taken (its utilisation per allocation is handed to the
    usage listeners, not kept: 2.8 KiB per node of strings nobody read again)."""
    connected: bool = False
    has_snapshot: bool = False
    """False until the first Snapshot since this controller started: taints are then held."""
    silent: bool = False
    """Connected or not, no message for longer than ``agent_timeout_s``."""
    last_seen: float = 0.0
    """Monotonic time of the last message."""
    waiting_until: float | None = None
    """Monotonic time until which a Hello naming this node waits for admission or was told to
    stay away (not authenticated yet: it only postpones silence, by at most
    ``waiting_grace_s``)."""
    boot_id: str = ""
    agent_version: str = ""
    expected_gpus: int | None = None
    """GPUs the node should have (the agent's Hello); fewer reported means some are missing."""
    capabilities: tuple[str, ...] | None = None
    """What the agent can execute for the remediation loop (its Hello); None: unknown (an
    agent older than the field, or none connected since this controller started)."""
    node_conditions: list[Condition] = field(default_factory=lambda: NOTHING)
    """The agent's verdicts about the node itself (``gpu-missing``), from its last Snapshot."""
    version: int = 0
    """Bumped by every Hello, Snapshot and state transition Event (whatever they changed):
    with :attr:`telemetry_version`, a reader deriving something from the record recomputes
    it only when either moved."""
    telemetry_version: int = 0
    """Bumped when a Heartbeat changes some GPU's telemetry (most Heartbeats repeat the last
    figures: nothing derived from them needs recomputing then)."""

    def gpus_missing(self) -> int:
        """GPUs expected and not reported: by the agent's own count (its ``gpu-missing``
        condition), or by the Hello's ``expected_gpus`` against the GPUs in the Snapshot."""
        by_count = max(0, (self.expected_gpus or 0) - len(self.gpus))
        flagged = any(c.code == GPU_MISSING_CODE for c in self.node_conditions)
        return max(by_count, 1 if flagged else 0)

    def gpus_by_index(self) -> list[GpuRecord]:
        return sorted(self.gpus.values(), key=lambda g: g.info.index)

    def worst_state(self) -> HealthState:
        if self.silent or not self.has_snapshot:
            return "unknown"
        if self.gpus_missing():
            return "unhealthy"
        return worst_state(g.state for g in self.gpus.values())


class FleetReader(Protocol):
    """What readers of the fleet model use (the fleet view, the status page): records by node,
    and change notifications. :class:`Fleet` implements it."""

    def nodes(self) -> list[NodeRecord]: ...

    def node(self, name: str) -> NodeRecord | None: ...

    def subscribe(self, listener: Listener) -> None: ...


class Fleet:
    def __init__(self, settings: FleetSettings | None = None, clock: Clock | None = None) -> None:
        self.settings = settings or FleetSettings()
        self._clock = clock or SystemClock()
        self._nodes: dict[str, NodeRecord] = {}
        self._listeners: list[Listener] = []
        self._usage_listeners: list[UsageListener] = []
        self.gpu_pods_started = 0
        """Pods that newly hold a GPU on a node, as its agent reports (the kubelet's
        PodResources): placed by a scheduler (or bound by hand). A node's first report to this
        controller is not counted (its pods may have started long before)."""
        self.missing: Callable[[str], bool] = lambda name: False
        """Whether a GPU node no agent has spoken for is past its grace
        (``gpuhealth.controller.incidents.unwatched``): its ``reporting`` is ``missing``, not
        ``no-data``."""

    # -- read side -------------------------------------------------------------------------

    def nodes(self) -> list[NodeRecord]:
        return list(self._nodes.values())

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def gpu(self, uuid: str) -> tuple[NodeRecord, GpuRecord] | None:
        for rec in self._nodes.values():
            g = rec.gpus.get(uuid)
            if g is not None:
                return rec, g
        return None

    def connected_count(self) -> int:
        return sum(1 for n in self._nodes.values() if n.connected)

    def node_health(self, name: str) -> NodeHealth:
        """The policy's input for one node (``no-data`` for a node no agent spoke for)."""
        rec = self._nodes.get(name)
        if rec is None:
            return NodeHealth(
                name=name, reporting="missing" if self.missing(name) else "no-data", gpus=()
            )
        reporting: Reporting = "ok"
        if rec.silent:
            reporting = "silent"
        elif not rec.has_snapshot:
            reporting = "missing" if self.missing(name) else "no-data"
        gpus = tuple(
            GpuHealth(
                index=g.info.index,
                uuid=g.info.uuid,
                state=g.state,
                conditions=tuple(g.conditions),
                mig_devices=tuple(g.info.mig_devices),
            )
            for g in rec.gpus_by_index()
        )
        return NodeHealth(
            name=name,
            reporting=reporting,
            gpus=gpus,
            gpus_missing=rec.gpus_missing(),
            node_conditions=tuple(rec.node_conditions),
        )

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def subscribe_usage(self, listener: UsageListener) -> None:
        """``listener(node, usage)`` with each heartbeat's utilisation per allocation (after
        its telemetry is applied, before the ``usage`` change is told)."""
        self._usage_listeners.append(listener)

    def _notify(self, node: str, kind: ChangeKind) -> None:
        for listener in self._listeners:
            try:
                listener(node, kind)
            except Exception:
                log.exception("fleet_listener_failed", node=node, kind=kind)

    # -- IngestSink --------------------------------------------------------------------------

    def _record(self, node: str) -> NodeRecord:
        rec = self._nodes.get(node)
        if rec is None:
            rec = NodeRecord(name=node)
            self._nodes[node] = rec
        return rec

    def _seen(self, rec: NodeRecord) -> bool:
        """Record a message; True when the node had been silent (its verdict may change)."""
        rec.last_seen = self._clock.monotonic()
        was_silent = rec.silent
        rec.silent = False
        return was_silent

    def on_connect(self, node: str, hello: Hello) -> None:
        rec = self._record(node)
        woke = self._seen(rec)
        rec.connected = True
        if rec.boot_id and hello.boot_id != rec.boot_id:
            log.info("node_rebooted", node=node, boot_id=hello.boot_id)
        rec.boot_id = hello.boot_id
        rec.agent_version = hello.agent_version
        rec.expected_gpus = hello.expected_gpus
        rec.capabilities = None if hello.capabilities is None else tuple(hello.capabilities)
        rec.version += 1
        for info in map(_shared_info, hello.gpus):
            g = rec.gpus.get(info.uuid)
            if g is None:
                rec.gpus[info.uuid] = GpuRecord(info=info)
            else:
                g.info = info
        self._notify(node, "health" if woke else "connection")

    def agent_waiting(self, node: str, until_s: float) -> None:
        """A Hello naming ``node`` waits for admission, or was told to come back: the
        controller, not the agent, is why it is quiet for the next ``until_s`` seconds. Only
        known nodes are noted (an unauthenticated claim never creates a record)."""
        rec = self._nodes.get(node)
        if rec is not None:
            until = self._clock.monotonic() + until_s
            rec.waiting_until = max(rec.waiting_until or 0.0, until)

    def on_disconnect(self, node: str) -> None:
        rec = self._nodes.get(node)
        if rec is not None:
            rec.connected = False
            self._notify(node, "connection")

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        rec = self._record(node)
        woke = self._seen(rec)
        if isinstance(msg, Snapshot):
            self._apply_snapshot(rec, msg)
        elif isinstance(msg, Event):
            if self._apply_event(rec, msg) or woke:
                self._notify(node, "health")
        else:
            self._apply_heartbeat(rec, msg)
            if woke:
                self._notify(node, "health")

    def _apply_snapshot(self, rec: NodeRecord, snap: Snapshot) -> None:
        before = self.node_health(rec.name)
        rec.version += 1
        gpus: dict[str, GpuRecord] = {}
        for st in snap.gpus:
            info = _shared_info(st.info)
            old = rec.gpus.get(info.uuid)
            since = old.state_since if old is not None and old.state == st.state else snap.taken_at
            gpus[info.uuid] = GpuRecord(
                info=info,
                state=st.state,
                conditions=_shared(st.conditions),
                telemetry=st.telemetry or (old.telemetry if old else None),
                state_since=since,
                fabric=st.fabric,
            )
        rec.gpus = gpus
        rec.node_conditions = _shared(snap.node_conditions)
        had_snapshot, rec.has_snapshot = rec.has_snapshot, True
        alloc_changed = rec.allocations != snap.allocations
        if alloc_changed:
            if had_snapshot:
                self.gpu_pods_started += len(_pods(snap.allocations) - _pods(rec.allocations))
            rec.allocations = _shared([_shared_allocation(a) for a in snap.allocations])
        if self.node_health(rec.name) != before:
            self._notify(rec.name, "health")
        if alloc_changed:
            self._notify(rec.name, "allocations")

    def _apply_event(self, rec: NodeRecord, ev: Event) -> bool:
        if ev.kind != "transition":
            return False
        rec.version += 1
        g = rec.gpus.get(ev.gpu_uuid)
        if g is None:
            g = GpuRecord(info=GpuInfo(index=ev.gpu_index, uuid=ev.gpu_uuid))
            rec.gpus[ev.gpu_uuid] = g
        changed = g.state != ev.current or g.conditions != ev.conditions
        if g.state != ev.current:
            g.state_since = ev.at
        g.state = ev.current
        g.conditions = _shared(ev.conditions)
        return changed

    def _apply_heartbeat(self, rec: NodeRecord, hb: Heartbeat) -> None:
        changed = False
        gpus = rec.gpus
        for t in hb.telemetry:
            g = gpus.get(t.uuid)
            if g is not None and g.telemetry != t:
                g.telemetry = t
                changed = True
        if changed:
            rec.telemetry_version += 1
        rec.usage_at = hb.at
        if hb.usage:
            for listener in self._usage_listeners:
                try:
                    listener(rec.name, hb.usage)
                except Exception:
                    log.exception("fleet_listener_failed", node=rec.name, kind="usage")
        self._notify(rec.name, "usage")

    # -- housekeeping ------------------------------------------------------------------------

    def check_silent(self) -> list[str]:
        """Mark nodes whose agent has not spoken for ``agent_timeout_s``; returns them."""
        now = self._clock.monotonic()
        newly: list[str] = []
        for rec in self._nodes.values():
            if not rec.silent and now - self._heard_at(rec) > self.settings.agent_timeout_s:
                rec.silent = True
                newly.append(rec.name)
        for name in newly:
            log.warning("agent_silent", node=name, timeout_s=self.settings.agent_timeout_s)
            self._notify(name, "health")
        return newly

    def _heard_at(self, rec: NodeRecord) -> float:
        """When the node's agent was last heard, or until when the controller kept it waiting
        (that counts until ``waiting_grace_s`` after the last message)."""
        if rec.waiting_until is None or rec.waiting_until <= rec.last_seen:
            return rec.last_seen
        return min(rec.waiting_until, rec.last_seen + self.settings.waiting_grace_s)

    async def run_silence_checker(self) -> None:
        while True:
            await self._clock.sleep(self.settings.stale_check_interval_s)
            self.check_silent()

    def forget(self, name: str) -> None:
        """The Node object was deleted."""
        if self._nodes.pop(name, None) is not None:
            self._notify(name, "removed")


def _shared_info(info: GpuInfo) -> GpuInfo:
    """``info`` with its UUID and model name interned: one string per value across the fleet
    (a node repeats its model for every GPU; the UUID reappears in allocations)."""
    return msgspec.structs.replace(
        info,
        uuid=sys.intern(info.uuid),
        model=sys.intern(info.model),
        mig_devices=_shared(info.mig_devices),
    )


def _pods(allocations: Iterable[Allocation]) -> set[tuple[str, str]]:
    return {(a.namespace, a.pod) for a in allocations}


def _shared_allocation(a: Allocation) -> Allocation:
    """``a`` with its names interned: shared with the GPU records, the idle tracker's keys and
    every other allocation of the same namespace and container."""
    return msgspec.structs.replace(
        a,
        namespace=sys.intern(a.namespace),
        pod=sys.intern(a.pod),
        container=sys.intern(a.container),
        gpu_uuid=sys.intern(a.gpu_uuid),
        device_id=sys.intern(a.device_id),
    )
