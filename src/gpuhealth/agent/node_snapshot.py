"""The node's cached snapshot: what scrapes and status reads see.

The engine loop writes (``mark_dirty`` after each observation or tick, ``set_allocations``
after a PodResources refresh); readers get an immutable :class:`NodeSnapshot`, rebuilt at most
once per change from the engine's in-memory state. Nothing here calls NVML or the kubelet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from gpuhealth.agent.health.rails import RailStatus
from gpuhealth.agent.observations import GpuSample, Inventory
from gpuhealth.common.clock import Clock
from gpuhealth.protocol import Allocation, Condition, GpuStatus


class EngineView(Protocol):
    """The read side of :class:`~gpuhealth.agent.health.engine.HealthEngine` that the snapshot
    needs."""

    def statuses(self) -> list[GpuStatus]: ...
    def xid_action_counts(self) -> dict[tuple[str, int, str], int]: ...
    def latest_samples(self) -> dict[str, GpuSample]: ...
    def inventory(self) -> Inventory | None: ...
    def node_conditions(self) -> list[Condition]: ...
    def gpus_missing(self) -> int: ...
    def nic_ports(self) -> list[RailStatus]: ...


@dataclass(frozen=True, slots=True)
class XidCount:
    uuid: str
    xid: int
    action: str
    count: int


@dataclass(frozen=True, slots=True)
class OpEventCount:
    """GPU Operational Events of one kind on one GPU (health.op_event_counts)."""

    uuid: str
    module: str
    code: int
    category: str
    handled: str
    count: int


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node: str
    taken_at: datetime
    inventory: Inventory | None
    statuses: tuple[GpuStatus, ...]
    samples: Mapping[str, GpuSample]
    xids: tuple[XidCount, ...]
    allocations: tuple[Allocation, ...]
    holder: Mapping[str, Allocation] = field(default_factory=dict)
    allocations_unknown: str | None = None
    """Why ``allocations`` may not be the kubelet's now (None: they are)."""
    """GPU UUID -> the container whose labels its series carry (the first, sorted, when a
    time-sliced or MIG GPU is shared)."""
    node_conditions: tuple[Condition, ...] = ()
    """Verdicts about the node no GPU carries (``gpu-missing``: fewer GPUs than expected)."""
    gpus_missing: int = 0
    """GPUs the node should have that no source sees."""
    op_events: tuple[OpEventCount, ...] = ()
    """GPU Operational Events seen, by kind (empty before drivers R615)."""
    nics: tuple[RailStatus, ...] = ()
    """The node's InfiniBand and RoCE ports as judged now, by device and port."""


def holders(allocations: tuple[Allocation, ...]) -> dict[str, Allocation]:
    out: dict[str, Allocation] = {}
    for a in sorted(allocations, key=lambda a: (a.gpu_uuid, a.namespace, a.pod, a.container)):
        out.setdefault(a.gpu_uuid, a)
    return out


class NodeSnapshotCache:
    def __init__(
        self,
        node: str,
        engine: EngineView,
        clock: Clock,
        *,
        sample_max_age_s: float | None = None,
    ) -> None:
        """``sample_max_age_s``: older samples are not exported (a hung GPU's last reading is
        no reading); None keeps every latest sample."""
        self.node = node
        self._max_age = sample_max_age_s
        self._engine = engine
        self._clock = clock
        self._allocations: tuple[Allocation, ...] = ()
        self._allocations_unknown: str | None = None
        self._snapshot: NodeSnapshot | None = None
        self._polled = False

    def mark_dirty(self) -> None:
        self._snapshot = None

    def note_sample(self) -> None:
        """A poll delivered samples: with an inventory, the agent is ready."""
        self._polled = True
        self._snapshot = None

    def set_allocations(self, allocations: list[Allocation]) -> bool:
        """Store the kubelet's current allocations; True when they differ from the last."""
        new = tuple(allocations)
        if new == self._allocations:
            return False
        self._allocations = new
        self._snapshot = None
        return True

    def set_allocations_unknown(self, why: str | None) -> bool:
        """Whether the allocations can be trusted (None) or why not; True when it changed."""
        if why == self._allocations_unknown:
            return False
        self._allocations_unknown = why
        self._snapshot = None
        return True

    @property
    def ready(self) -> bool:
        return self._polled and self._engine.inventory() is not None

    def snapshot(self) -> NodeSnapshot:
        snap = self._snapshot
        if snap is None:
            snap = self._snapshot = self._build()
        return snap

    def _build(self) -> NodeSnapshot:
        statuses = tuple(sorted(self._engine.statuses(), key=lambda s: s.info.index))
        xids = tuple(
            XidCount(uuid=uuid, xid=xid, action=action, count=n)
            for (uuid, xid, action), n in sorted(self._engine.xid_action_counts().items())
        )
        now = self._clock.now()
        return NodeSnapshot(
            node=self.node,
            taken_at=now,
            inventory=self._engine.inventory(),
            statuses=statuses,
            samples=self._fresh_samples(now),
            xids=xids,
            allocations=self._allocations,
            holder=holders(self._allocations),
            allocations_unknown=self._allocations_unknown,
            node_conditions=tuple(self._engine.node_conditions()),
            gpus_missing=self._engine.gpus_missing(),
            op_events=self._op_events(),
            nics=tuple(self._engine.nic_ports()),
        )

    def _op_events(self) -> tuple[OpEventCount, ...]:
        counts = getattr(self._engine, "op_event_counts", None)  # optional in EngineView
        if counts is None:
            return ()
        out: dict[tuple[str, str, int, str, str], int] = counts()
        return tuple(
            OpEventCount(uuid=u, module=m, code=c, category=cat, handled=h, count=n)
            for (u, m, c, cat, h), n in sorted(out.items())
        )

    def _fresh_samples(self, now: datetime) -> dict[str, GpuSample]:
        samples = self._engine.latest_samples()
        if self._max_age is None:
            return dict(samples)
        oldest = now - timedelta(seconds=self._max_age)
        return {u: s for u, s in samples.items() if s.at >= oldest}
