"""Which shard a node belongs to, and how fleet-wide limits are split (pure).

Past one process the fleet is cut into ``S`` shards (docs/architecture.md, "Past one
process"): a node belongs to shard :func:`~gpuhealth.protocol.shards.shard_of` ``(key, S)``, a
stable hash (the contract with the agents: :mod:`gpuhealth.protocol.shards`) of its shard key
(:func:`shard_key`): its NVLink domain where its labels name one (the clique label, else the
first present topology label: the labels the domain monitor groups nodes by), else its name. So
a domain is never split across shards, and is decided by the one shard that owns it. The
cluster-wide singleton writes the shard on the Node as a label (:func:`desired_shard`;
:func:`relabels`: the Nodes whose label is missing or says another shard), and the shards'
owners select their Nodes by it; relabelling is the only way a node moves. The label lives
under ``node-restriction.kubernetes.io/`` (:attr:`Keys.shard_label` in
:mod:`gpuhealth.controller.names`), where NodeRestriction keeps a node's own kubelet from
moving itself into a shard nobody owns.

The breaker's budget and remediation's caps are fleet-wide; with shards each owner gets a part
in proportion to its shards' GPU nodes (:func:`split`; each owner's sum in
:func:`gpuhealth.controller.shards.sizes.part`), so that no hot-path write waits on another
shard and the parts never add up to more than the whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuhealth.protocol.shards import shard_of

__all__ = ["desired_shard", "relabels", "shard_key", "shard_of", "shard_sizes", "split"]


def shard_key(
    name: str, labels: Mapping[str, str], *, clique_label: str, topology_labels: Sequence[str]
) -> str:
    """What node ``name`` is sharded by: the value of its ``clique_label`` label, else the
    value of the first of ``topology_labels`` it has, else its name. A label present but empty
    names no domain, as for the domain monitor (a first topology label that is empty leaves
    the node in no domain: its name)."""
    clique = labels.get(clique_label)
    if clique:
        return clique
    for key in topology_labels:
        if key in labels:
            return labels[key] or name
    return name


def desired_shard(
    name: str,
    labels: Mapping[str, str],
    count: int,
    *,
    clique_label: str,
    topology_labels: Sequence[str],
) -> int:
    """The shard of node ``name`` with ``labels`` among ``count``: the shard of its key
    (:func:`shard_key`)."""
    key = shard_key(name, labels, clique_label=clique_label, topology_labels=topology_labels)
    return shard_of(key, count)


def relabels(
    nodes: Mapping[str, Mapping[str, str]],
    count: int,
    *,
    shard_label: str,
    clique_label: str,
    topology_labels: Sequence[str],
) -> dict[str, str]:
    """The shard label each node must get: those of ``nodes`` (node name to its labels) whose
    ``shard_label`` is missing or is not their :func:`desired_shard`, to that shard's value
    (the shard as a decimal string)."""
    out = {}
    for node, labels in nodes.items():
        want = str(
            desired_shard(
                node, labels, count, clique_label=clique_label, topology_labels=topology_labels
            )
        )
        if labels.get(shard_label) != want:
            out[node] = want
    return out


def shard_sizes(shards: Iterable[int], count: int) -> list[int]:
    """How many nodes each of ``count`` shards holds, given each node's shard."""
    sizes = [0] * count
    for shard in shards:
        sizes[shard] += 1
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
