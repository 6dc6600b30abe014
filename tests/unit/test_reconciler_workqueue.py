"""The work queue: dedup, no concurrent processing of a key, backoff with a FakeClock."""

from __future__ import annotations

import asyncio

from gpuhealth.common.clock import FakeClock
from gpuhealth.controller.workqueue import WorkQueue


async def test_dedup_and_order() -> None:
    q = WorkQueue(FakeClock())
    for k in ["a", "b", "a", "c", "b"]:
        q.add(k)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_readded_while_processing_comes_back_after_done() -> None:
    q = WorkQueue(FakeClock())
    q.add("a")
    k = await q.get()
    q.add("a")
    q.add("a")
    assert q._ready.empty()  # not handed to a second worker
    q.done(k)
    assert await asyncio.wait_for(q.get(), 1) == "a"
    q.done("a")
    assert q._ready.empty()


async def test_backoff_doubles_caps_and_resets() -> None:
    clock = FakeClock()
    q = WorkQueue(clock, backoff_base_s=0.1, backoff_max_s=0.5)
    assert [q.add_after_failure("a") for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    q.forget("a")
    assert q.backoff("a") == 0.1
    await q.close()


async def test_add_after_waits_for_the_clock() -> None:
    clock = FakeClock()
    q = WorkQueue(clock)
    q.add_after("a", 5)
    await clock.advance_and_settle(0)
    assert len(q) == 0
    await clock.advance_and_settle(4.9)
    assert len(q) == 0
    await clock.advance_and_settle(0.2)
    assert len(q) == 1
    assert await q.get() == "a"
