"""Node pools (``gpuhealth.controller.fleet.pools``): a node's pool from its labels, and the GPU
nodes per pool kept from the node watch."""

from __future__ import annotations

import pytest

from gpuhealth.controller.fleet.pools import NO_POOL, NodePools, pool_of
from gpuhealth.controller.kube.node_view import NodeView


@pytest.mark.parametrize(
    ("labels", "keys", "pool"),
    [
        ({}, None, NO_POOL),
        ({"karpenter.sh/nodepool": "h100"}, None, "h100"),
        ({"cloud.google.com/gke-nodepool": "g", "karpenter.sh/nodepool": "k"}, None, "k"),
        ({"cloud.google.com/gke-nodepool": "g", "eks.amazonaws.com/nodegroup": "e"}, None, "e"),
        ({"kubernetes.azure.com/agentpool": "a"}, None, "a"),
        ({"node.kubernetes.io/pool": "generic"}, None, "generic"),
        ({"karpenter.sh/nodepool": ""}, None, NO_POOL),
        ({"team/pool": "t", "karpenter.sh/nodepool": "k"}, ("team/pool",), "t"),
        ({"karpenter.sh/nodepool": "k"}, ("team/pool",), NO_POOL),
    ],
)
def test_pool_of(labels: dict[str, str], keys: tuple[str, ...] | None, pool: str) -> None:
    assert (pool_of(labels) if keys is None else pool_of(labels, keys)) == pool


def view(name: str, pool: str | None, gpus: int = 8, rv: str = "1") -> NodeView:
    labels = {"karpenter.sh/nodepool": pool} if pool is not None else {}
    return NodeView(name=name, resource_version=rv, labels=labels, gpus=gpus)


def test_gpu_nodes_per_pool_follow_the_watch() -> None:
    pools = NodePools()
    pools.on_node("added", None, view("a1", "a"))
    pools.on_node("added", None, view("a2", "a"))
    pools.on_node("added", None, view("b1", "b"))
    pools.on_node("added", None, view("cpu", "a", gpus=0))
    pools.on_node("added", None, view("loose", None))
    assert pools.counts() == {"a": 2, "b": 1, NO_POOL: 1}
    assert (pools.pool("a1"), pools.pool("cpu"), pools.pool("loose")) == ("a", "a", NO_POOL)
    assert pools.pool("unknown") == NO_POOL and pools.gpu_nodes("unknown") == 0
    # relabelled into another pool, then deleted
    pools.on_node("modified", view("a2", "a"), view("a2", "b", rv="2"))
    assert pools.counts() == {"a": 1, "b": 2, NO_POOL: 1}
    pools.on_node("deleted", view("b1", "b"), None)
    pools.on_node("deleted", view("a1", "a"), None)
    assert pools.counts() == {"b": 1, NO_POOL: 1}
    assert pools.pool("a1") == NO_POOL
    # a node that gains GPU capacity counts from then on
    pools.on_node("modified", view("cpu", "a", gpus=0), view("cpu", "a", gpus=4, rv="2"))
    assert pools.gpu_nodes("a") == 1
