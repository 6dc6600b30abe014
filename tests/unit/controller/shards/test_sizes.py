"""The shard sizes ConfigMap's content, read and refused, and an owner's part of a fleet-wide
limit: exact, never more than the whole across owners, an even split while sizes are unknown.
The reader against the real API server: tests/integration/test_shard_labeller.py."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.shards.assignment import split
from gpuhealth.controller.shards.sizes import SizesError, parse_sizes, part, sizes_data
from gpuhealth.protocol.shards import MAX_SHARDS


def test_the_data_written_reads_back() -> None:
    data = sizes_data(3, [5000, 0, 4998])
    assert data == {"count": "3", "sizes": "[5000,0,4998]"}
    assert parse_sizes(data, 3) == (5000, 0, 4998)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({}, "invalid"),
        ({"count": "3"}, "invalid"),  # no sizes
        ({"count": "three", "sizes": "[1,2,3]"}, "invalid"),
        ({"count": "-3", "sizes": "[1,2,3]"}, "invalid"),
        ({"count": "4", "sizes": "[1,2,3]"}, "count"),  # another release's count
        ({"count": "3", "sizes": "[1,2"}, "invalid"),  # not JSON
        ({"count": "3", "sizes": '{"a": 1}'}, "invalid"),
        ({"count": "3", "sizes": "[1,2]"}, "invalid"),  # not one per shard
        ({"count": "3", "sizes": "[1,-2,3]"}, "invalid"),
        ({"count": "3", "sizes": "[1,2.5,3]"}, "invalid"),
        ({"count": "3", "sizes": "[1,true,3]"}, "invalid"),
        ({"count": "3", "sizes": '[1,"2",3]'}, "invalid"),
        ({"count": 3, "sizes": "[1,2,3]"}, "invalid"),
    ],
)
def test_damaged_content_is_refused_with_its_reason(
    data: Mapping[str, object], reason: str
) -> None:
    with pytest.raises(SizesError) as refused:
        parse_sizes(data, 3)
    assert refused.value.reason == reason


@given(
    data=st.dictionaries(
        st.sampled_from(["count", "sizes", "other"]),
        st.one_of(st.text(max_size=40), st.integers(), st.none()),
    ),
    count=st.integers(1, MAX_SHARDS),
)
def test_any_content_reads_as_sizes_or_is_refused(data: dict[str, object], count: int) -> None:
    try:
        sizes = parse_sizes(data, count)
    except SizesError as exc:
        assert exc.reason in ("invalid", "count")
    else:
        assert len(sizes) == count and all(s >= 0 for s in sizes)


@pytest.mark.parametrize(
    ("total", "sizes", "owned", "count", "expected"),
    [
        (100, [5000, 5000, 5000, 5000], {0}, 4, 25),
        (100, [5000, 5000, 5000, 5000], {1, 3}, 4, 50),
        (100, [5000, 5000, 5000, 5000], {0, 1, 2, 3}, 4, 100),  # one owner of every shard
        (10, [6000, 3000, 1000], {0}, 3, 6),
        (10, [6000, 3000, 1000], {2}, 3, 1),
        (3, [9990, 5, 5], {1}, 3, 1),  # at least one per shard with nodes
        (5, [100, 0, 100], {1}, 3, 0),  # a shard without GPU nodes
        (5, [100, 0, 100], set(), 3, 0),  # owns nothing
        (5, [100, 0, 100], {7}, 3, 0),  # a shard the count does not have
        # sizes unknown (None, or of another count): an even split, never the whole
        (100, None, {0}, 4, 25),
        (100, None, {0, 2}, 4, 50),
        (2, None, {0}, 4, 1),  # [1, 1, 0, 0]: the lowest shards get the remainder
        (2, None, {3}, 4, 0),
        (100, [1, 2, 3], {0}, 4, 25),
    ],
)
def test_an_owners_part(
    total: int, sizes: list[int] | None, owned: set[int], count: int, expected: int
) -> None:
    assert part(total, sizes, owned, count=count) == expected


@given(
    total=st.integers(0, 5000),
    sizes=st.one_of(st.none(), st.lists(st.integers(0, 20_000), min_size=1, max_size=16)),
    count=st.integers(1, 16),
    owners=st.lists(st.integers(0, 3), min_size=16, max_size=16),
)
def test_the_owners_parts_never_add_up_to_more_than_the_whole(
    total: int, sizes: list[int] | None, count: int, owners: list[int]
) -> None:
    """However the shards are spread over owners (each shard owned once), and whether the
    sizes are known or not: the parts add up to the whole at most."""
    owned: dict[int, set[int]] = {}
    for shard in range(count):
        owned.setdefault(owners[shard], set()).add(shard)
    parts = [part(total, sizes, shards, count=count) for shards in owned.values()]
    assert all(p >= 0 for p in parts)
    assert sum(parts) <= total
    known = sizes is not None and len(sizes) == count
    if not known or sum(sizes or ()):
        assert sum(parts) == total  # nothing lost either, unless no shard has a GPU node
    if not known:
        assert parts == [sum(split(total, [1] * count)[i] for i in s) for s in owned.values()]
