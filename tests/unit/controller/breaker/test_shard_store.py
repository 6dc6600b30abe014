"""The breaker's state of several shards: loaded as their union (never looser than any of
them), saved per shard (each node's entries to its shard, the open state to every owned one).
The ConfigMaps themselves: tests/integration/test_breaker_shards.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.breaker.shard_store import by_shard, same_state, shard_configmap, union
from gpuhealth.controller.breaker.store import OpenPool, StoredBreaker, WindowEntry

T1, T2, T3 = "2026-12-02T10:00:00+00:00", "2026-12-02T10:05:00+00:00", "2026-12-02T10:09:00+00:00"
SHARD = {"a": 0, "b": 1, "c": 2, "d": 1}


def entry(node: str, at: str = T1, pool: str = "") -> WindowEntry:
    return WindowEntry(node=node, at=at, pool=pool)


def test_the_map_of_a_shard() -> None:
    assert shard_configmap("gpuhealth-breaker", 3) == "gpuhealth-breaker-shard-3"


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], None),
        ([StoredBreaker(open=False)], StoredBreaker(open=False)),
        (  # one open: open, its trip kept
            [
                StoredBreaker(open=False, trips=1, window=(entry("a"),)),
                StoredBreaker(open=True, trips=3, tripped_at=T2, message="blocked", window=()),
            ],
            StoredBreaker(
                open=True, trips=3, tripped_at=T2, message="blocked", window=(entry("a"),)
            ),
        ),
        (  # both open: the earliest trip
            [
                StoredBreaker(open=True, trips=2, tripped_at=T3),
                StoredBreaker(open=True, trips=1, tripped_at=T2),
            ],
            StoredBreaker(open=True, trips=2, tripped_at=T2),
        ),
        (  # a node in two windows: its latest admission; the window by time
            [
                StoredBreaker(open=False, window=(entry("a", T1), entry("b", T3))),
                StoredBreaker(open=False, window=(entry("a", T2, "p1"), entry("c", T1))),
            ],
            StoredBreaker(
                open=False, window=(entry("c", T1), entry("a", T2, "p1"), entry("b", T3))
            ),
        ),
        (  # a pool open in either is open, with its most trips
            [
                StoredBreaker(open=False, pools=(OpenPool("p1", T1, 1),)),
                StoredBreaker(open=False, pools=(OpenPool("p2", T2, 1), OpenPool("p1", T2, 2))),
            ],
            StoredBreaker(open=False, pools=(OpenPool("p1", T2, 2), OpenPool("p2", T2, 1))),
        ),
    ],
)
def test_union(states: list[StoredBreaker], expected: StoredBreaker | None) -> None:
    assert union(states) == expected


def test_an_unreadable_time_counts_as_the_earlier_admission() -> None:
    merged = union(
        [
            StoredBreaker(open=False, window=(entry("a", "garbage"),)),
            StoredBreaker(open=False, window=(entry("a", T1),)),
        ]
    )
    assert merged is not None and merged.window == (entry("a", T1),)


def test_each_entry_goes_to_its_nodes_shard_and_the_open_state_to_every_one() -> None:
    pools = (OpenPool("p1", T1, 1),)
    state = StoredBreaker(
        open=True,
        trips=2,
        tripped_at=T2,
        message="m",
        window=(entry("a"), entry("b"), entry("c"), entry("d"), entry("gone")),
        pools=pools,
    )
    parts = by_shard(state, {1, 2}, SHARD.get)
    assert sorted(parts) == [1, 2]
    # a (shard 0, not owned) and gone (unknown) are kept in the lowest owned shard's map
    assert [e.node for e in parts[1].window] == ["a", "b", "d", "gone"]
    assert [e.node for e in parts[2].window] == ["c"]
    for part in parts.values():
        assert (part.open, part.trips, part.tripped_at, part.message, part.pools) == (
            True,
            2,
            T2,
            "m",
            pools,
        )
    assert by_shard(state, (), SHARD.get) == {}


@given(
    window=st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([T1, T2, T3])), max_size=20
    ),
    owned=st.sets(st.integers(0, 3), min_size=1),
    opened=st.booleans(),
)
def test_what_is_saved_loads_back_as_it_was(
    window: list[tuple[str, str]], owned: set[int], opened: bool
) -> None:
    """Saved per shard, then loaded as their union: the same state (each node once, at its
    latest admission), never a node lost, never closed."""
    state = union(
        [
            StoredBreaker(
                open=opened,
                tripped_at=T1 if opened else "",
                window=tuple(entry(n, at) for n, at in window),
            )
        ]
    )
    assert state is not None
    shard_of = {n: i % 4 for i, n in enumerate("abcdefgh")}
    back = union(list(by_shard(state, owned, shard_of.get).values()))
    assert back == state


def test_a_zoneless_time_is_utc() -> None:
    merged = union(
        [
            StoredBreaker(open=False, window=(entry("a", "2026-12-02T10:06:00"),)),
            StoredBreaker(open=False, window=(entry("a", T2),)),
        ]
    )
    assert merged is not None and merged.window == (entry("a", "2026-12-02T10:06:00"),)


WINDOW = (entry("a", T1), entry("b", T2, "p1"))


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (StoredBreaker(open=False, window=WINDOW), True),
        (  # the times drift by microseconds each time the window is written out
            StoredBreaker(
                open=False,
                window=(entry("a", "2026-12-02T10:00:00.000093+00:00"), entry("b", T2, "p1")),
            ),
            True,
        ),
        (StoredBreaker(open=False, window=(entry("a", T1), entry("b", T3, "p1"))), False),
        (StoredBreaker(open=False, window=(entry("a", T1), entry("b", T2))), False),
        (StoredBreaker(open=False, window=(entry("a", T1),)), False),
        (StoredBreaker(open=False, window=(entry("a", "x"), entry("b", T2, "p1"))), False),
        (StoredBreaker(open=True, window=WINDOW), False),
        (StoredBreaker(open=False, trips=1, window=WINDOW), False),
        (StoredBreaker(open=False, window=WINDOW, pools=(OpenPool("p1"),)), False),
    ],
)
def test_same_state(other: StoredBreaker, same: bool) -> None:
    assert same_state(StoredBreaker(open=False, window=WINDOW), other) is same
