"""What the loop observes: the one seam between the pure decisions and the world.

- The observations, as plain values (:class:`Observed`, :class:`NodeFacts`,
  :class:`PodFacts` ...): the inputs of the pure decisions. The runner gathers them
  (:func:`gpuhealth.controller.remediation.runner.observe`) from the fleet (agent verdicts,
  boot id, GPU allocations), the node watch cache (taints, labels), the API server (pods,
  PodDisruptionBudgets) and the agents' action reports.
- The ports the runner is built with (narrow protocols): :class:`EpisodeStore`
  (``controller/remediation/episode_store.py``), :class:`PodReader` and :class:`Disruptor`
  (``controller/remediation/pods.py``), :class:`ReportReader`
  (``controller/remediation/action_reports.py``), :class:`NodeFactsReader` (:class:`FleetNodeReader`
  below: the fleet plus the node cache), :class:`OrderSender` (the agent stream,
  ``assembly.StreamOrders``), :class:`Quarantiner` (the taint reconciler) and
  :class:`KubeEventSink` (the Event writer).

Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gpuhealth.controller.remediation.model import Episode, Spec, Status
from gpuhealth.protocol import Allocation, Condition
from gpuhealth.protocol.remediation import ActionReport, Order
from gpuhealth.protocol.v1 import CAPABILITIES

if TYPE_CHECKING:  # the ports' signatures only: gang and status build on these values
    from gpuhealth.controller.fleet.model import Fleet
    from gpuhealth.controller.remediation.gang import Gang
    from gpuhealth.controller.remediation.status import EvictionOutcome, Note

Reporting = Literal["ok", "no-data", "silent"]


@dataclass(frozen=True, slots=True)
class GpuFacts:
    uuid: str
    index: int
    state: str
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One node as the fleet (agent) and the node cache (API server) see it."""

    name: str
    reporting: Reporting = "ok"
    """``ok``: a snapshot arrived since the agent connected; ``silent``: it stopped talking."""
    connected: bool = True
    boot_id: str = ""
    gpus: tuple[GpuFacts, ...] = ()
    allocations: tuple[Allocation, ...] | None = ()
    """Who holds which GPU (PodResources); None when the agent cannot attribute."""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    capabilities: frozenset[str] | None = frozenset(CAPABILITIES)
    """What the node's agent said it can execute (its Hello); None: unknown (an older agent,
    or none connected). ``FleetNodeReader`` always sets it."""

    def has_taint(self, key: str) -> bool:
        return any(t.get("key") == key for t in self.taints)

    def gpu(self, uuid: str) -> GpuFacts | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    node: str = ""
    phase: str = "Running"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[tuple[str, str], ...] = ()
    """(kind, name) of each ownerReference."""
    deletion_timestamp: datetime | None = None
    grace_period_s: int | None = None
    """metadata.deletionGracePeriodSeconds while terminating, else the spec's."""
    gpu_request: int = 0
    """Sum of the containers' GPU limits (requests)."""
    created: datetime | None = None
    """metadata.creationTimestamp (a gang member created after the drain began is a
    replacement, never evicted)."""
    release_owned: bool = False
    """In gpuhealth's own namespace and controlled by a ReplicaSet or a DaemonSet (the
    release's Deployment and DaemonSet chain): with the protected labels, gpuhealth itself.
    A label alone, which any tenant can set, never is."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PdbFacts:
    """A PodDisruptionBudget as the eviction API would judge it."""

    namespace: str
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()
    selects_all: bool = False
    """An empty selector ``{}`` selects every pod of the namespace (policy/v1)."""
    disruptions_allowed: int = 0
    up_to_date: bool = True
    """status.observedGeneration >= metadata.generation (else the API refuses evictions)."""


@dataclass(frozen=True, slots=True)
class ValidationPodFacts:
    name: str
    phase: str
    message: str = ""
    foreign: str = ""
    """Why the pod of that name is not the one the loop created (owner, labels, node): then
    the validation fails, whatever its phase."""


@dataclass(frozen=True, slots=True)
class EpisodeAdmission:
    """The fleet-wide answer for a Pending episode (safety.admission)."""

    allowed: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    now: datetime
    node: NodeFacts | None
    """None: the Node object is gone."""
    pods: tuple[PodFacts, ...] = ()
    """Pods bound to the node."""
    gang_pods: tuple[PodFacts, ...] = ()
    """Pods of the target pods' gangs, wherever they run."""
    off_limits: Mapping[str, str] = field(default_factory=dict)
    """Other nodes of those pods that an operator keeps the loop off (opt-out or exclude
    label), with the label: a gang with a member there is not evicted."""
    pdbs: tuple[PdbFacts, ...] = ()
    report: ActionReport | None = None
    """The agent's latest report for ``status.order.id``."""
    validation_pod: ValidationPodFacts | None = None
    admission: EpisodeAdmission = EpisodeAdmission(allowed=True)


class NodeObject(Protocol):
    """What the node cache keeps of a Node (``gpuhealth.controller.kube.node_view.NodeView``)."""

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def taints(self) -> tuple[Mapping[str, Any], ...]: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...


class NodeObjects(Protocol):
    """The node watch cache (``gpuhealth.controller.kube.node_cache.NodeCache``)."""

    def get(self, name: str) -> NodeObject | None: ...

    def gpu_node_count(self) -> int: ...


class FleetNodeReader:
    def __init__(self, fleet: Fleet, nodes: NodeObjects) -> None:
        self._fleet = fleet
        self._nodes = nodes

    def node(self, name: str) -> NodeFacts | None:
        obj = self._nodes.get(name)
        if obj is None:
            return None
        rec = self._fleet.node(name)
        if rec is None:
            return NodeFacts(
                name=name,
                reporting="no-data",
                connected=False,
                allocations=None,
                labels=obj.labels,
                taints=obj.taints,
                annotations=obj.annotations,
                capabilities=None,
            )
        reporting: Reporting = "ok"
        if rec.silent:
            reporting = "silent"
        elif not rec.has_snapshot:
            reporting = "no-data"
        return NodeFacts(
            name=name,
            reporting=reporting,
            connected=rec.connected,
            boot_id=rec.boot_id,
            gpus=tuple(
                GpuFacts(
                    uuid=g.info.uuid,
                    index=g.info.index,
                    state=g.state,
                    conditions=tuple(g.conditions),
                )
                for g in rec.gpus_by_index()
            ),
            allocations=tuple(rec.allocations) if rec.has_snapshot else None,
            labels=obj.labels,
            taints=obj.taints,
            annotations=obj.annotations,
            capabilities=None if rec.capabilities is None else frozenset(rec.capabilities),
        )

    def gpu_nodes(self) -> int:
        return max(self._nodes.gpu_node_count(), len(self._fleet))

    def candidates(self) -> list[str]:
        """Nodes with an unhealthy GPU (looked at on every resync: a new leader finds the
        faults that arrived before it led)."""
        return sorted(
            rec.name
            for rec in self._fleet.nodes()
            if any(g.state == "unhealthy" for g in rec.gpus.values())
        )


class EpisodeStore(Protocol):
    """GPURemediation objects: reads from a watch cache, writes to the API server."""

    def episodes(self) -> list[Episode]: ...

    def get(self, name: str) -> Episode | None: ...

    async def create(self, name: str, spec: Spec, labels: Mapping[str, str]) -> Episode | None:
        """None when an object of that name exists already (the same fault)."""

    async def write_status(self, ep: Episode, status: Status) -> Episode:
        """Guarded by ``ep.resource_version``; raises ``ConflictError`` when it moved."""

    async def delete(self, name: str) -> None: ...


class NodeFactsReader(Protocol):
    def node(self, name: str) -> NodeFacts | None:
        """None when the Node object does not exist."""

    def gpu_nodes(self) -> int:
        """Nodes with GPUs (the denominator of the concurrency fraction)."""

    def candidates(self) -> list[str]:
        """Nodes that may need an episode (an unhealthy GPU), considered on every resync."""


class PodReader(Protocol):
    async def pods_on_node(self, node: str) -> list[PodFacts]: ...

    async def gang_members(self, gang: Gang) -> list[PodFacts]: ...

    async def pod(self, namespace: str, name: str) -> PodFacts | None: ...

    async def pdbs(self, namespace: str) -> list[PdbFacts]: ...

    async def validation_pod(
        self, namespace: str, name: str, ep: Episode
    ) -> ValidationPodFacts | None:
        """The pod of that name, and whether it is the one created for ``ep``."""


class Disruptor(Protocol):
    async def evict(
        self, pod: PodFacts, grace_period_s: int | None
    ) -> tuple[EvictionOutcome, str]: ...

    async def force_delete(self, pod: PodFacts) -> None: ...

    async def create_validation_pod(self, name: str, node: str, ep: Episode) -> None: ...

    async def set_node_label(self, node: str, key: str, value: str | None) -> None: ...


class OrderSender(Protocol):
    async def send(self, node: str, order: Order) -> bool:
        """True when the order was written to the node's live agent stream."""


class ReportReader(Protocol):
    def latest(self, node: str, order_id: str) -> ActionReport | None: ...


class Quarantiner(Protocol):
    def quarantine(self, node: str) -> None:
        """Make sure the node gets the quarantine taint (the taint writer's business)."""


class KubeEventSink(Protocol):
    async def post(self, ep: Episode, note: Note, now: datetime) -> None: ...


class Clocked(Protocol):
    def now(self) -> datetime: ...


def unique_pods(pods: Sequence[PodFacts]) -> list[PodFacts]:
    seen: dict[str, PodFacts] = {}
    for p in pods:
        seen.setdefault(p.uid or f"{p.namespace}/{p.name}", p)
    return list(seen.values())
