"""The shard of a node and the split of fleet-wide limits: stable, balanced, exact."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.shards.assignment import (
    desired_shard,
    relabels,
    shard_key,
    shard_of,
    shard_sizes,
    split,
)
from gpuhealth.protocol.shards import MAX_SHARDS

NODES = [f"gpu-node-{i:05d}" for i in range(20_000)]
CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
BLOCK = "cloud.example.com/network-block"
SHARD = "node-restriction.kubernetes.io/gpuhealth.io-shard"
KEYS = {"clique_label": CLIQUE, "topology_labels": (RACK, BLOCK)}


@pytest.mark.parametrize(
    ("node", "count", "expected"),
    [
        ("gpu-node-00000", 1, 0),
        ("gpu-node-00000", 4, int.from_bytes(hashlib.sha256(b"gpu-node-00000").digest()[:8]) % 4),
        ("ip-10-0-3-17.ec2.internal", 20, None),
    ],
)
def test_shard_of_is_the_names_sha256_modulo_the_count(
    node: str, count: int, expected: int | None
) -> None:
    got = shard_of(node, count)
    assert 0 <= got < count
    if expected is not None:
        assert got == expected
    assert shard_of(node, count) == got  # no salt: the same in every process


@pytest.mark.parametrize("count", [0, -1, MAX_SHARDS + 1])
def test_a_count_outside_the_bounds_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="shard count"):
        shard_of("gpu-node-00000", count)


@pytest.mark.parametrize("count", [2, 4, 8, 20])
def test_shards_are_balanced_over_a_fleet(count: int) -> None:
    """As uniform draws would be: every shard within 4 standard deviations of the mean."""
    sizes = shard_sizes((shard_of(n, count) for n in NODES), count)
    mean = len(NODES) / count
    assert sum(sizes) == len(NODES)
    assert all(abs(s - mean) < 4 * mean**0.5 for s in sizes), sizes


@pytest.mark.parametrize(
    ("name", "labels", "key"),
    [
        ("n1", {}, "n1"),  # in no domain: its name
        ("n1", {"other": "x"}, "n1"),
        ("n1", {CLIQUE: "uuid-a.1"}, "uuid-a.1"),  # the clique label's value
        ("n1", {CLIQUE: "uuid-a.1", RACK: "r7"}, "uuid-a.1"),  # over a topology label
        ("n1", {RACK: "r7"}, "r7"),  # no clique: the first topology label present
        ("n1", {BLOCK: "b2"}, "b2"),
        ("n1", {RACK: "r7", BLOCK: "b2"}, "r7"),  # the first in the settings' order wins
        ("n1", {CLIQUE: "", RACK: "r7"}, "r7"),  # an empty clique names no domain
        ("n1", {RACK: "", BLOCK: "b2"}, "n1"),  # the first present, empty: no domain
    ],
)
def test_a_nodes_key_is_its_domain_else_its_name(
    name: str, labels: dict[str, str], key: str
) -> None:
    assert shard_key(name, labels, **KEYS) == key
    for count in (1, 3, 64):
        assert desired_shard(name, labels, count, **KEYS) == shard_of(key, count)


def test_without_topology_labels_only_the_clique_label_counts() -> None:
    keys = {"clique_label": CLIQUE, "topology_labels": ()}
    assert shard_key("n1", {RACK: "r7"}, **keys) == "n1"
    assert shard_key("n1", {CLIQUE: "c"}, **keys) == "c"


label_values = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=0, max_size=20)
node_labels = st.fixed_dictionaries(
    {}, optional={CLIQUE: label_values, RACK: label_values, BLOCK: label_values}
)


@given(
    domain=st.text(alphabet="abcdefghij0123456789.-", min_size=1, max_size=30),
    members=st.lists(
        st.tuples(st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=20), node_labels),
        min_size=2,
        max_size=20,
    ),
    count=st.integers(1, MAX_SHARDS),
    by_rack=st.booleans(),
)
def test_a_domains_nodes_always_share_a_shard(
    domain: str, members: list[tuple[str, dict[str, str]]], count: int, by_rack: bool
) -> None:
    """Whatever their names and other labels: nodes with one clique label value, or (none of
    them having a clique) one first topology label value, land in one shard."""
    shards = set()
    for name, own in members:
        labels = dict(own)
        if by_rack:
            labels.pop(CLIQUE, None)
            labels[RACK] = domain
        else:
            labels[CLIQUE] = domain
        shards.add(desired_shard(name, labels, count, **KEYS))
    assert shards == {shard_of(domain, count)}


def test_relabels_names_the_nodes_whose_label_is_missing_or_wrong() -> None:
    nodes: dict[str, dict[str, str]] = {n: {SHARD: str(shard_of(n, 4))} for n in NODES[:1000]}
    nodes["new-node"] = {}
    nodes[NODES[0]] = {SHARD: "9"}  # a hand edit
    nodes["tray-1"] = {CLIQUE: "rack-a.0", SHARD: str(shard_of("tray-1", 4))}
    keys = {"shard_label": SHARD, **KEYS}
    want = relabels(nodes, 4, **keys)
    expected = {
        "new-node": str(shard_of("new-node", 4)),
        NODES[0]: str(shard_of(NODES[0], 4)),
        "tray-1": str(shard_of("rack-a.0", 4)),
    }
    assert shard_of("tray-1", 4) != shard_of("rack-a.0", 4)  # labelled by its name: wrong
    assert want == expected
    labelled = {
        n: {**labels, SHARD: want.get(n, labels.get(SHARD, ""))} for n, labels in nodes.items()
    }
    assert relabels(labelled, 4, **keys) == {}
    moved = relabels(labelled, 5, **keys)  # another count moves only some nodes
    assert 0 < len(moved) < len(labelled)
    assert all(v == str(desired_shard(n, labelled[n], 5, **KEYS)) for n, v in moved.items())


@pytest.mark.parametrize(
    ("total", "sizes", "expected"),
    [
        (100, [5000, 5000, 5000, 5000], [25, 25, 25, 25]),
        (10, [6000, 3000, 1000], [6, 3, 1]),
        (10, [5000, 5000, 5000], [4, 3, 3]),  # the largest remainder first, the lowest shard
        (3, [9990, 5, 5], [1, 1, 1]),  # every shard with nodes can taint at least one
        (2, [9990, 5, 5], [2, 0, 0]),  # not enough for all: proportional
        (5, [100, 0, 100], [3, 0, 2]),  # an empty shard gets nothing
        (0, [100, 100], [0, 0]),
        (7, [0, 0], [0, 0]),
    ],
)
def test_split_is_proportional_and_exact(total: int, sizes: list[int], expected: list[int]) -> None:
    assert split(total, sizes) == expected


@given(
    total=st.integers(0, 10_000),
    sizes=st.lists(st.integers(0, 50_000), min_size=1, max_size=MAX_SHARDS),
)
def test_split_never_hands_out_more_than_the_whole(total: int, sizes: list[int]) -> None:
    parts = split(total, sizes)
    assert len(parts) == len(sizes)
    assert all(p >= 0 for p in parts)
    assert sum(parts) == (total if sum(sizes) else 0)
    assert all(p == 0 for p, s in zip(parts, sizes, strict=True) if s == 0)
    with_nodes = sum(1 for s in sizes if s)
    if total >= with_nodes:
        assert all(p >= 1 for p, s in zip(parts, sizes, strict=True) if s)


def test_split_refuses_negatives() -> None:
    with pytest.raises(ValueError, match="never negative"):
        split(-1, [1])
