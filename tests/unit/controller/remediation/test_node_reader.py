"""FleetNodeReader: the fleet's agent view and the node cache's Node, as NodeFacts."""

from __future__ import annotations

from typing import Any

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.pools import NodePools
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.remediation.node_reader import FleetNodeReader
from tests.support.fleet import connect, send_transition
from tests.support.protocol import XID79, gpu_uuid, hello


def View(
    labels: dict[str, str] | None = None, taints: tuple[dict[str, Any], ...] = (), **kw: Any
) -> NodeView:
    return NodeView(name="", resource_version="1", labels=labels or {}, taints=taints, **kw)


class Cache:
    def __init__(self, views: dict[str, View]) -> None:
        self.views = views

    def get(self, name: str) -> View | None:
        return self.views.get(name)

    def gpu_node_count(self) -> int:
        return len(self.views)


def test_node_facts_join_the_agent_and_the_node_object() -> None:
    fleet = Fleet()
    taint = {"key": "k", "effect": "NoSchedule"}
    cache = Cache({"n1": View({"a": "b"}, (taint,)), "n2": View()})
    src = FleetNodeReader(fleet, cache)
    assert src.node("missing") is None
    bare = src.node("n2")
    assert bare is not None and bare.reporting == "no-data" and bare.allocations is None
    connect(fleet, "n1", gpus=2)
    send_transition(fleet, "n1", 1, "unhealthy", XID79)
    facts = src.node("n1")
    assert facts is not None
    assert facts.labels == {"a": "b"} and facts.has_taint("k")
    assert facts.reporting == "ok" and facts.boot_id
    assert [g.state for g in facts.gpus] == ["healthy", "unhealthy"]
    assert facts.gpu(gpu_uuid(1, "n1")) is not None
    assert src.candidates() == ["n1"] and src.gpu_nodes() == 2


def test_node_facts_carry_the_node_objects_identity_cordon_conditions_owners_and_pool() -> None:
    owner = ("karpenter.sh/v1", "NodeClaim", "nc-1", "uid-nc")
    view = View(
        {"karpenter.sh/nodepool": "a100"},
        uid="uid-n1",
        unschedulable=True,
        conditions=(("AcceleratedHardwareReady", "False"),),
        owners=(owner,),
        gpus=8,
    )
    pools = NodePools()
    pools.on_node(
        "added", None, NodeView(name="n1", resource_version="1", labels=view.labels, gpus=8)
    )
    src = FleetNodeReader(Fleet(), Cache({"n1": view}), pools)
    facts = src.node("n1")
    assert facts is not None
    assert (facts.uid, facts.unschedulable, facts.owners, facts.pool) == (
        "uid-n1",
        True,
        (owner,),
        "a100",
    )
    assert facts.conditions == (("AcceleratedHardwareReady", "False"),)
    assert src.pool("n1") == "a100" and src.pool_nodes("a100") == 1
    assert FleetNodeReader(Fleet(), Cache({"n1": view})).node("n1").pool == ""  # type: ignore[union-attr]


def test_capabilities_come_from_the_agents_hello() -> None:
    """What the agent said it can execute; an agent older than the field: unknown (None)."""
    fleet = Fleet()
    src = FleetNodeReader(fleet, Cache({"new": View(), "old": View(), "gone": View()}))
    fleet.on_connect("new", hello("new", capabilities=["reset-gpu", "validate"]))
    fleet.on_connect("old", hello("old", capabilities=None))
    assert src.node("new").capabilities == {"reset-gpu", "validate"}  # type: ignore[union-attr]
    assert src.node("old").capabilities is None  # type: ignore[union-attr]
    assert src.node("gone").capabilities is None  # type: ignore[union-attr]
