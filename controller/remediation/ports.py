"""The runner's view of the world: narrow protocols it is built with.

Implementations: ``controller/kube/gpuremediations.py`` (:class:`EpisodeStore`),
``controller/kube/remediation_pods.py`` (:class:`PodSource`, :class:`Disruptor`),
``controller/remediation/reports.py`` (:class:`ReportSource`), and, wired in by the
controller, the fleet plus node cache (:class:`NodeSource`), the agent stream
(:class:`OrderSender`), the taint reconciler (:class:`Quarantiner`) and the Event writer
(:class:`EventSink`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from gpuhealth.controller.remediation.actions import Note, OrderRequest
from gpuhealth.controller.remediation.facts import (
    NodeFacts,
    PdbFacts,
    PodFacts,
    ValidationPodFacts,
)
from gpuhealth.controller.remediation.gang import Gang
from gpuhealth.controller.remediation.model import Episode, Spec, Status
from gpuhealth.controller.remediation.outcomes import EvictionOutcome
from gpuhealth.protocol.remediation import ActionReport


class EpisodeStore(Protocol):
    """GPURemediation objects: reads from a watch cache, writes to the API server."""

    def episodes(self) -> list[Episode]: ...

    def get(self, name: str) -> Episode | None: ...

    async def create(self, name: str, spec: Spec, labels: Mapping[str, str]) -> Episode | None:
        """None when an object of that name exists already (the same fault)."""

    async def write_status(self, ep: Episode, status: Status) -> Episode:
        """Guarded by ``ep.resource_version``; raises ``ConflictError`` when it moved."""

    async def delete(self, name: str) -> None: ...


class NodeSource(Protocol):
    def node(self, name: str) -> NodeFacts | None:
        """None when the Node object does not exist."""

    def gpu_nodes(self) -> int:
        """Nodes with GPUs (the denominator of the concurrency fraction)."""

    def candidates(self) -> list[str]:
        """Nodes that may need an episode (an unhealthy GPU), considered on every resync."""


class PodSource(Protocol):
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
    async def send(self, node: str, episode: str, request: OrderRequest) -> bool:
        """True when the order was written to the node's live agent stream."""


class ReportSource(Protocol):
    def latest(self, node: str, order_id: str) -> ActionReport | None: ...


class Quarantiner(Protocol):
    def quarantine(self, node: str) -> None:
        """Make sure the node gets the quarantine taint (the taint writer's business)."""


class EventSink(Protocol):
    async def post(self, ep: Episode, note: Note, now: datetime) -> None: ...


class Clocked(Protocol):
    def now(self) -> datetime: ...


def unique_pods(pods: Sequence[PodFacts]) -> list[PodFacts]:
    seen: dict[str, PodFacts] = {}
    for p in pods:
        seen.setdefault(p.uid or f"{p.namespace}/{p.name}", p)
    return list(seen.values())
