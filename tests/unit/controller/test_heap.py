"""The controller's collector tuning: a larger young generation, and the caches frozen once
their first LIST is in (controller/heap.py)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from gpuhealth.controller.heap import (
    HELD_THRESHOLD,
    HOLD_CHECK_S,
    freeze_when_synced,
    hold_full,
    hold_full_collections,
    time_collections,
    tune_collector,
)
from tests.support.clock import FakeClock


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_only_the_young_threshold_changes() -> None:
    _, older, oldest = gc.get_threshold()
    tune_collector(50_000)
    assert gc.get_threshold() == (50_000, older, oldest)


async def test_what_is_alive_once_every_cache_synced_is_frozen() -> None:
    nodes, pods = asyncio.Event(), asyncio.Event()
    freezing = asyncio.create_task(freeze_when_synced([nodes, pods]))
    nodes.set()
    await asyncio.sleep(0)
    assert not freezing.done() and gc.get_freeze_count() == 0  # the pods' LIST is not in
    cache = [{"node": i} for i in range(1000)]  # stands for the Node cache
    pods.set()
    await asyncio.wait_for(freezing, 5)
    assert gc.get_freeze_count() > len(cache)
    before = gc.get_freeze_count()
    gc.collect()
    assert gc.get_freeze_count() == before  # a full collection no longer walks them


def test_every_collection_is_timed_by_its_generation_until_stopped() -> None:
    seen: list[tuple[int, float]] = []
    stop = time_collections(lambda gen, s: seen.append((gen, s)))
    try:
        garbage = [[i] for i in range(200_000)]
        gc.collect(2)
        gc.collect(0)
    finally:
        stop()
    del garbage
    assert [g for g, _ in seen[-2:]] == [2, 0]
    assert all(s >= 0 for _, s in seen)
    full = seen[-2][1]
    assert full > seen[-1][1]  # a full collection walked 200,000 more objects than a young one
    recorded = len(seen)
    gc.collect(2)
    assert len(seen) == recorded  # nothing recorded once stopped


@pytest.mark.parametrize(
    ("storm", "held_for_s", "max_s", "held"),
    [
        (False, None, 120.0, False),  # quiet: full collections run
        (True, None, 120.0, True),  # a storm begins: they wait
        (True, 60.0, 120.0, True),
        (True, 120.0, 120.0, False),  # waited the longest allowed: let one run
        (False, 30.0, 120.0, False),  # the storm is over: the one held back runs
        (True, None, 0.0, False),  # 0: never held
    ],
)
def test_full_collections_wait_only_during_a_storm_and_not_forever(
    storm: bool, held_for_s: float | None, max_s: float, held: bool
) -> None:
    assert hold_full(storm, held_for_s, max_s) is held


async def test_the_full_threshold_is_raised_during_a_storm_and_restored_after() -> None:
    clock = FakeClock()
    gc.set_threshold(5_000, 10, 10)
    storm = False
    task = asyncio.create_task(hold_full_collections(lambda: storm, clock, 5.0))
    await clock.advance_and_settle(0)
    assert gc.get_threshold() == (5_000, 10, 10)
    storm = True
    await clock.advance_and_settle(HOLD_CHECK_S)
    assert gc.get_threshold() == (5_000, 10, HELD_THRESHOLD)  # young collections unchanged
    for _ in range(5):
        await clock.advance_and_settle(HOLD_CHECK_S)
    assert gc.get_threshold() == (5_000, 10, 10)  # held 5 s: one may run
    await clock.advance_and_settle(HOLD_CHECK_S)
    assert gc.get_threshold() == (5_000, 10, HELD_THRESHOLD)  # and they wait again
    storm = False
    await clock.advance_and_settle(HOLD_CHECK_S)
    assert gc.get_threshold() == (5_000, 10, 10)
    storm = True
    await clock.advance_and_settle(HOLD_CHECK_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gc.get_threshold() == (5_000, 10, 10)  # stopped mid-storm: restored
