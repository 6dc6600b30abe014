"""The runner's :class:`~gpuhealth.controller.remediation.ports.NodeFactsReader`: one node as
the fleet (its agent) and the node watch cache (the API server) see it, and the nodes that may
need an episode."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts, Reporting
from gpuhealth.controller.taints.policy import Taint


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
    def __init__(
        self,
        fleet: Fleet,
        nodes: NodeObjects,
        acknowledged: Callable[[str], frozenset[Taint]] = lambda _node: frozenset(),
    ) -> None:
        """``acknowledged``: a node's taints of ours removed by hand and not put back (the
        reconciler's acknowledgements: the override incidents)."""
        self._fleet = fleet
        self._nodes = nodes
        self._acknowledged = acknowledged

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
                acknowledged=self._acknowledged(name),
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
            acknowledged=self._acknowledged(name),
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
