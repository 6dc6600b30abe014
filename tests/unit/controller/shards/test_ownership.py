"""Which shards a replica asks for: its own, its fair share of the free ones, any left free
for too long; never one that is held and live."""

from __future__ import annotations

import pytest

from gpuhealth.controller.shards.ownership import ShardView, fair_share, to_campaign

TAKEOVER = 30.0


def views(*holders: str, dead: tuple[int, ...] = (), free_for: float = 0.0) -> list[ShardView]:
    """One view per shard: its holder ('' none); shards in ``dead`` not renewed in time."""
    return [
        ShardView(
            shard=i,
            holder=h,
            live=bool(h) and i not in dead,
            free_for_s=free_for if (not h or i in dead) else 0.0,
        )
        for i, h in enumerate(holders)
    ]


@pytest.mark.parametrize(
    ("count", "replicas", "share"), [(4, 2, 2), (4, 3, 2), (4, 5, 1), (1, 2, 1), (5, 1, 5)]
)
def test_fair_share(count: int, replicas: int, share: int) -> None:
    assert fair_share(count, replicas) == share


@pytest.mark.parametrize(
    ("seen", "me", "replicas", "expected"),
    [
        # a fresh release: the first replica asks for its share, the lowest shards first
        (views("", "", "", ""), "a", 2, {0, 1}),
        # the second sees the first holding its share and asks for the rest
        (views("a", "a", "", ""), "b", 2, {2, 3}),
        # split: each keeps its own and asks for nothing else
        (views("a", "a", "b", "b"), "a", 2, {0, 1}),
        (views("a", "a", "b", "b"), "b", 2, {2, 3}),
        # a third replica (the spare of S + 1) holds nothing while every shard is held
        (views("a", "b", "c", "d"), "e", 5, set()),
        # the spare takes a lost shard at once: it is under its share
        (views("a", "b", "c", "d", dead=(2,), free_for=1.0), "e", 5, {2}),
        # a full replica does not take a freshly lost shard (the spare or an emptier one will)
        (views("a", "a", "b", "b", dead=(2, 3), free_for=1.0), "a", 2, {0, 1}),
        # ... but takes it once it has stayed free for the takeover time
        (views("a", "a", "b", "b", dead=(2, 3), free_for=TAKEOVER), "a", 2, {0, 1, 2, 3}),
        # a released shard (no holder) is free as well
        (views("a", "", "b", "b", free_for=0.0), "a", 2, {0, 1}),
        # one shard, two replicas: today's leader and standby
        (views(""), "a", 2, {0}),
        (views("a"), "b", 2, set()),
    ],
)
def test_to_campaign(seen: list[ShardView], me: str, replicas: int, expected: set[int]) -> None:
    assert to_campaign(seen, me, replicas=replicas, takeover_after_s=TAKEOVER) == expected


def test_a_live_shard_of_another_replica_is_never_asked_for() -> None:
    seen = views("b", "b", "b", "b")
    assert to_campaign(seen, "a", replicas=1, takeover_after_s=0.0) == frozenset()
