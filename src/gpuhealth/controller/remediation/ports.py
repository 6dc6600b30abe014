"""The narrow ports the remediation runner is built with (protocols), and who implements each:
:class:`EpisodeStore` (``remediation/episode_store.py``), :class:`PodReader` and
:class:`Disruptor` (``remediation/pods.py``), :class:`ReportReader`
(``remediation/action_reports.py``), :class:`NodeFactsReader`
(``remediation/node_reader.py``: the fleet plus the node cache), :class:`OrderSender` (the
agents' stream, ``assembly.StreamOrders``), :class:`Quarantiner` (the taint reconciler) and
:class:`KubeEventSink` (``remediation/kube_events.py``). The hard-write gate is
``breaker/gate.py``'s ``HardWriteGate``; :class:`BreakerRoomReader` reads its breaker's room
without asking it (``assembly.GateRoom``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from gpuhealth.controller.remediation.facts import (
    BreakerRoom,
    NodeFacts,
    PdbFacts,
    PodFacts,
    ValidationPodFacts,
)
from gpuhealth.controller.remediation.gang import Gang
from gpuhealth.controller.remediation.model import Episode, Spec, Status
from gpuhealth.controller.remediation.outcomes import EvictionOutcome
from gpuhealth.controller.remediation.step import Note
from gpuhealth.protocol.remediation import ActionReport, Order


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

    async def validation_pod(self, namespace: str, name: str) -> ValidationPodFacts | None:
        """The pod of that name, whoever made it (its UID says whether it is ours)."""


class Disruptor(Protocol):
    async def evict(
        self, pod: PodFacts, grace_period_s: int | None
    ) -> tuple[EvictionOutcome, str]: ...

    async def force_delete(self, pod: PodFacts) -> None: ...

    async def create_validation_pod(self, name: str, node: str, ep: Episode) -> str | None:
        """The created pod's UID; None when the name was taken already."""

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


class BreakerRoomReader(Protocol):
    def room(self) -> BreakerRoom:
        """What the circuit breaker would admit now (nothing is counted)."""
