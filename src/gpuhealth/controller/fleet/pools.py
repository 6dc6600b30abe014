"""Node pools: the pool a node is in, and how many GPU nodes each pool has.

A node's pool is the value of the first of ``fleet.pool_labels`` it carries (default
:data:`~gpuhealth.controller.names.DEFAULT_POOL_LABELS`: Karpenter's NodePool, EKS's node
group, GKE's node pool, AKS's agent pool, a generic one); a node with none is in pool ``""``.
The circuit breaker and the remediation caps give every named pool a budget of its own
besides the fleet-wide one (docs/operations.md "Budgets per node pool"); pool ``""`` has only
the fleet-wide one.

A pool label is read from the Node, whose own kubelet may set most labels: a node that lies
about its pool moves itself into another pool's budget, never out of the fleet-wide one, so a
pool budget only ever adds a bound.

:class:`NodePools` keeps each node's pool and the GPU nodes per pool from the node watch, so a
gate request never scans the fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from gpuhealth.controller.kube.node_cache import Change
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import DEFAULT_POOL_LABELS

NO_POOL = ""
"""The pool of a node that carries none of the pool labels (only the fleet-wide budgets)."""


def pool_of(labels: Mapping[str, str], keys: Sequence[str] = DEFAULT_POOL_LABELS) -> str:
    """The value of the first of ``keys`` among ``labels``; :data:`NO_POOL` without one."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return NO_POOL


class NodePools:
    """Node -> pool, and GPU nodes per pool, kept up to date by the node watch's listener
    (:meth:`on_node`, subscribed to ``gpuhealth.controller.kube.node_cache.NodeCache``)."""

    def __init__(self, keys: Sequence[str] = DEFAULT_POOL_LABELS) -> None:
        self.keys = tuple(keys)
        self._pool: dict[str, str] = {}
        self._gpu_node: set[str] = set()
        self._gpu_nodes: Counter[str] = Counter()

    def on_node(self, change: Change, old: NodeView | None, new: NodeView | None) -> None:
        view = new if new is not None else old
        if view is None:
            return
        name = view.name
        self._forget(name)
        if change == "deleted" or new is None:
            return
        pool = pool_of(new.labels, self.keys)
        self._pool[name] = pool
        if new.gpus > 0:
            self._gpu_node.add(name)
            self._gpu_nodes[pool] += 1

    def _forget(self, name: str) -> None:
        pool = self._pool.pop(name, None)
        if name in self._gpu_node:
            self._gpu_node.discard(name)
            if pool is not None:
                self._gpu_nodes[pool] -= 1
                if self._gpu_nodes[pool] <= 0:
                    del self._gpu_nodes[pool]

    def pool(self, node: str) -> str:
        """The node's pool (:data:`NO_POOL` for a node not watched or in none)."""
        return self._pool.get(node, NO_POOL)

    def gpu_nodes(self, pool: str) -> int:
        """GPU nodes (``gpu_resource`` in their capacity) of ``pool``."""
        return self._gpu_nodes.get(pool, 0)

    def counts(self) -> dict[str, int]:
        """GPU nodes per pool (pools with none left out)."""
        return dict(self._gpu_nodes)
