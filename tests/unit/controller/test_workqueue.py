"""The work queue: dedup, no concurrent processing of a key, backoff with a FakeClock."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from gpuhealth.controller.workqueue import WorkQueue, run_worker
from tests.support.clock import FakeClock
from tests.support.ticks import Ticks


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


async def test_worker_forgets_on_success_and_backs_off_on_false_or_error() -> None:
    """run_worker: True forgets the key's backoff; False or a raise requeues it after the
    backoff (on the injected clock); the key is marked done every time."""
    clock = FakeClock()
    q = WorkQueue(clock, backoff_base_s=1.0, backoff_max_s=8.0)
    answers = {"ok": [True], "later": [False, True], "boom": [RuntimeError("api down"), True]}
    calls: list[str] = []
    handled: asyncio.Queue[str] = asyncio.Queue()

    async def handle(key: str) -> bool:
        calls.append(key)
        handled.put_nowait(key)
        answer = answers[key].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def next_call() -> None:
        await asyncio.wait_for(handled.get(), 1)
        await clock.advance_and_settle(0)  # the worker finishes the key

    worker = asyncio.create_task(run_worker(q, handle, failure_event="test_failed"))
    try:
        for key in ("ok", "later", "boom"):
            q.add(key)
        for _ in range(3):
            await next_call()
        assert calls == ["ok", "later", "boom"]
        assert (q.failures("ok"), q.failures("later"), q.failures("boom")) == (0, 1, 1)
        assert q.processing == 0 and len(q) == 0  # both retries wait for the clock
        await clock.advance_and_settle(1.0)
        for _ in range(2):
            await next_call()
        assert sorted(calls[3:]) == ["boom", "later"]
        assert q.failures("later") == q.failures("boom") == 0  # forgotten after success
        assert q.processing == 0 and len(q) == 0
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await q.close()


async def test_a_key_that_always_fails_waits_the_cap_without_overflow() -> None:
    q = WorkQueue(FakeClock(), backoff_base_s=0.05, backoff_max_s=30.0)
    delays = [q.add_after_failure("k") for _ in range(1100)]  # 0.05 * 2**1024 overflowed
    assert delays[-1] == 30.0 and q.failures("k") == 1100 and q.backoff("k") == 30.0
    await q.close()


async def test_the_worker_yields_between_keys_handled_without_suspending() -> None:
    """A handler that never suspends (nothing to write) does not hold the event loop for
    the whole queue: other work runs between any two keys."""
    q = WorkQueue(FakeClock())
    for i in range(20):
        q.add(f"n{i}")
    seen: list[int] = []
    async with Ticks() as ticks:

        async def handle(_key: str) -> bool:
            seen.append(ticks.n)
            return True

        worker = asyncio.create_task(run_worker(q, handle, failure_event="failed"))
        async with asyncio.timeout(3):
            while len(seen) < 20:
                await asyncio.sleep(0)
        worker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await worker
    assert all(b > a for a, b in itertools.pairwise(seen))  # never two keys in a turn
    await q.close()
