"""What the remediation loop observes, as plain values: the inputs of its pure decisions.

The runner gathers them (:func:`gpuhealth.controller.remediation.runner.observe`) through its
ports (:mod:`gpuhealth.controller.remediation.ports`) from the fleet (agent verdicts, boot id,
GPU allocations), the node watch cache (taints, labels), the API server (pods,
PodDisruptionBudgets) and the agents' action reports. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gpuhealth.controller.taints.policy import Taint
from gpuhealth.protocol import Allocation, Condition
from gpuhealth.protocol.remediation import ActionReport
from gpuhealth.protocol.v1 import CAPABILITIES

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
    acknowledged: frozenset[Taint] = frozenset()
    """Its taints of ours removed by hand and not put back (the override incidents)."""
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
    """The pod of the validation pod's name, whoever made it: only its UID tells whether it
    is the one the loop created (``ValidationStatus.pod_uid``)."""

    name: str
    phase: str
    uid: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class EpisodeAdmission:
    """The fleet-wide answer for a Pending episode (safety.admission)."""

    allowed: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class BreakerRoom:
    """What the circuit breaker would admit now, read without asking it (asking counts, and
    a refusal opens it): the nodes it admitted within its window (more hard writes there cost
    nothing) and how many more it admits before it opens."""

    admitted: frozenset[str] = frozenset()
    free: int | None = None
    """More nodes it admits now (0 while it is open); None: the breaker is off."""
    open: bool = False

    def new(self, nodes: Iterable[str]) -> set[str]:
        """Those of ``nodes`` that would each take a place in the breaker's budget."""
        return set(nodes) - self.admitted

    def fits(self, nodes: Iterable[str]) -> bool:
        """Would every one of ``nodes`` be admitted now, without opening the breaker?"""
        return self.free is None or len(self.new(nodes)) <= self.free


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
    breaker: BreakerRoom | None = None
    """The circuit breaker's room, observed while Draining (None: not known, the gate
    decides alone)."""


def unique_pods(pods: Sequence[PodFacts]) -> list[PodFacts]:
    seen: dict[str, PodFacts] = {}
    for p in pods:
        seen.setdefault(p.uid or f"{p.namespace}/{p.name}", p)
    return list(seen.values())
