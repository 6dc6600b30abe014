"""The shard of a node and the split of fleet-wide limits: stable, balanced, exact."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.shards.assignment import (
    relabels,
    shard_of,
    shard_sizes,
    split,
)
from gpuhealth.protocol.shards import MAX_SHARDS

NODES = [f"gpu-node-{i:05d}" for i in range(20_000)]


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
    sizes = shard_sizes(NODES, count)
    mean = len(NODES) / count
    assert sum(sizes) == len(NODES)
    assert all(abs(s - mean) < 4 * mean**0.5 for s in sizes), sizes


def test_going_from_one_count_to_another_moves_only_relabelled_nodes() -> None:
    labels: dict[str, str | None] = {n: str(shard_of(n, 4)) for n in NODES[:1000]}
    labels["new-node"] = None
    labels[NODES[0]] = "9"  # a hand edit
    want = relabels(labels, 4)
    assert want == {"new-node": str(shard_of("new-node", 4)), NODES[0]: str(shard_of(NODES[0], 4))}
    assert relabels({**labels, **want}, 4) == {}
    moved = relabels({**labels, **want}, 5)
    assert 0 < len(moved) < len(labels)
    assert all(v == str(shard_of(n, 5)) for n, v in moved.items())


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
