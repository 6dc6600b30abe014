"""Which shard a GPU node belongs to, and how fleet-wide limits are split (pure).

Past one process the fleet is cut into ``S`` shards (docs/architecture.md, "Past one
process"): node ``n`` belongs to shard
:func:`~gpuhealth.protocol.shards.shard_of` ``(n, S)``, a stable hash of its name (the
contract with the agents: :mod:`gpuhealth.protocol.shards`). The cluster-wide singleton writes
it on the Node as a label (:func:`relabels`: the Nodes whose label is missing or says
another shard), and the shards' owners select their Nodes by it; relabelling is the only way a
node moves. The label lives under ``node-restriction.kubernetes.io/`` (:attr:`Keys.shard_label`
in :mod:`gpuhealth.controller.names`), where NodeRestriction keeps a node's own kubelet from
moving itself into a shard nobody owns.

The breaker's budget and remediation's caps are fleet-wide; with shards each owner gets a part
in proportion to its shard's nodes (:func:`split`), so that no hot-path write waits on another
shard and the parts never add up to more than the whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuhealth.protocol.shards import shard_of

__all__ = ["relabels", "shard_of", "shard_sizes", "split"]


def relabels(labels: Mapping[str, str | None], count: int) -> dict[str, str]:
    """The shard label each node must get: those of ``labels`` (node name to its shard label's
    value, None when it has none) whose value is not their shard's, to that shard's value."""
    out = {}
    for node, have in labels.items():
        want = str(shard_of(node, count))
        if have != want:
            out[node] = want
    return out


def shard_sizes(nodes: Iterable[str], count: int) -> list[int]:
    """How many of ``nodes`` each shard holds."""
    sizes = [0] * count
    for node in nodes:
        sizes[shard_of(node, count)] += 1
    return sizes


def split(total: int, sizes: Sequence[int]) -> list[int]:
    """``total`` (a budget of nodes, a concurrency cap) split over shards in proportion to
    their ``sizes``, by largest remainder: the parts add up to exactly ``total``; a shard with
    no node gets nothing; and, when ``total`` allows it, every shard with nodes gets at least
    one (a shard whose part rounds to 0 could never taint or remediate at all)."""
    if total < 0 or any(s < 0 for s in sizes):
        raise ValueError("a budget and the shards' sizes are never negative")
    nodes = sum(sizes)
    if nodes == 0 or total == 0:
        return [0] * len(sizes)
    exact = [total * s / nodes for s in sizes]
    parts = [int(e) for e in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in by_remainder[: total - sum(parts)]:
        parts[i] += 1
    with_nodes = [i for i, s in enumerate(sizes) if s]
    if total >= len(with_nodes):
        for i in with_nodes:
            if parts[i] == 0:
                donor = max(range(len(parts)), key=lambda j: (parts[j], -j))
                parts[donor] -= 1
                parts[i] += 1
    return parts
