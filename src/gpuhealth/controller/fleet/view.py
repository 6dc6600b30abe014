"""The fleet as people see it: one model behind ``/api/v1/fleet``, the status page's
``/api/v1/overview`` and the ``gpuhealth_nodes`` / ``gpuhealth_gpus`` gauges.

A node is listed when an agent has spoken for it or the cluster has it with GPUs
(``status.capacity`` of the GPU resource). Its state is its worst GPU state in the one
severity order (:data:`gpuhealth.protocol.HEALTH_STATES`); a node no agent reports for (none
yet, no Snapshot since this controller started, or a silent agent) is ``unknown``, and so
are the GPUs of a silent agent. Nodes are listed in natural name order (``gpu-node-2`` before
``gpu-node-10``), GPUs by index. Every view and every count is derived from
:func:`build_fleet_view`, so they cannot disagree. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.controller.fleet.model import FleetReader, GpuRecord, NodeRecord
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.names import EXCLUDE_VALUE, Keys
from gpuhealth.protocol import HEALTH_STATES, Allocation, HealthState

_NUM = re.compile(r"(\d+)")

Taint = Mapping[str, Any]
"""A taint as the API server returns it (``key``, ``value``, ``effect``)."""


def natural_key(name: str) -> list[Any]:
    """``gpu-node-2`` before ``gpu-node-10``."""
    return [int(p) if p.isdigit() else p for p in _NUM.split(name)]


def taint_text(t: Taint) -> str:
    """``key=value:Effect``."""
    return f"{t.get('key', '')}={t.get('value') or ''}:{t.get('effect', '')}"


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node of the fleet: what its agent reported and what the cluster has."""

    name: str
    state: HealthState
    """The worst state of its GPUs; ``unknown`` when no agent reports for it."""
    agent: NodeRecord | None
    """The fleet model of its agent (read-only); None when no agent has spoken for the node."""
    node: NodeView | None
    """The Node from the watch cache; None when the cluster does not have it (any more)."""
    ours: tuple[Taint, ...]
    """The taints under gpuhealth's prefix, as on the Node."""
    foreign: tuple[Taint, ...]
    """Every other taint on the Node."""
    excluded: bool
    """The Node carries the operator's exclude label (``Keys.exclude_label``)."""

    @property
    def connected(self) -> bool:
        return self.agent is not None and self.agent.connected

    @property
    def silent(self) -> bool:
        return self.agent is not None and self.agent.silent

    @property
    def reporting(self) -> bool:
        """A Snapshot arrived since this controller started."""
        return self.agent is not None and self.agent.has_snapshot

    @property
    def gpus(self) -> list[GpuRecord]:
        """By index."""
        return self.agent.gpus_by_index() if self.agent is not None else []

    @property
    def allocations(self) -> list[Allocation]:
        return self.agent.allocations if self.agent is not None else []

    @property
    def condition(self) -> NodeCondition | None:
        """The Node's ``GPUHealthy`` condition."""
        return self.node.condition if self.node is not None else None

    def gpu_state(self, gpu: GpuRecord) -> HealthState:
        """The state a GPU is counted in: ``unknown`` while its agent is silent."""
        return "unknown" if self.silent else gpu.state


@dataclass(frozen=True, slots=True)
class StateCounts:
    nodes: dict[str, int]
    """Nodes by state, every state present (in :data:`HEALTH_STATES` order)."""
    gpus: dict[str, int]
    """GPUs by state, every state present."""


@dataclass(frozen=True, slots=True)
class FleetView:
    nodes: tuple[NodeStatus, ...]
    """In natural name order."""

    def counts(self) -> StateCounts:
        nodes: dict[str, int] = dict.fromkeys(HEALTH_STATES, 0)
        gpus: dict[str, int] = dict.fromkeys(HEALTH_STATES, 0)
        for n in self.nodes:
            nodes[n.state] += 1
            for g in n.gpus:
                gpus[n.gpu_state(g)] += 1
        return StateCounts(nodes=nodes, gpus=gpus)

    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


def node_status(
    name: str, agent: NodeRecord | None, node: NodeView | None, keys: Keys
) -> NodeStatus:
    taints = node.taints if node is not None else ()
    return NodeStatus(
        name=name,
        state=agent.worst_state() if agent is not None else "unknown",
        agent=agent,
        node=node,
        ours=tuple(t for t in taints if keys.owns(str(t.get("key", "")))),
        foreign=tuple(t for t in taints if not keys.owns(str(t.get("key", "")))),
        excluded=node is not None and node.labels.get(keys.exclude_label) == EXCLUDE_VALUE,
    )


def build_fleet_view(fleet: FleetReader, nodes: Iterable[NodeView], keys: Keys) -> FleetView:
    """Every node an agent spoke for, and every cluster Node with GPUs."""
    by_name = {v.name: v for v in nodes}
    names = {r.name for r in fleet.nodes()}
    names.update(v.name for v in by_name.values() if v.gpus > 0)
    return FleetView(
        nodes=tuple(
            node_status(n, fleet.node(n), by_name.get(n), keys)
            for n in sorted(names, key=natural_key)
        )
    )
