"""Deadlines follow the clock: the system clock's are asyncio's, the fake clock's expire when
the test advances it (no real time passes), and settle() runs the loop until it is quiet."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuhealth.common.clock import Clock, SystemClock
from tests.support.clock import FakeClock


async def test_a_fake_deadline_expires_only_when_the_clock_passes_it() -> None:
    clock = FakeClock()
    never = asyncio.Event()
    outcome: list[str] = []

    async def waiter() -> None:
        try:
            async with clock.timeout(5.0):
                await never.wait()
        except TimeoutError:
            outcome.append("timeout")

    task = asyncio.create_task(waiter())
    await clock.settle()
    assert clock.pending_sleepers == 0  # a deadline is not a sleeper
    await clock.advance_and_settle(4.9)
    assert outcome == [] and not task.done()
    await clock.advance_and_settle(0.1)
    assert outcome == ["timeout"] and task.done()


async def test_a_block_that_finishes_in_time_is_not_cancelled_later() -> None:
    clock = FakeClock()
    async with clock.timeout(5.0):
        await clock.settle()
    await clock.advance_and_settle(10.0)  # the cancelled deadline does nothing
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0


async def test_fake_wait_for() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    async def value() -> int:
        await gate.wait()
        return 7

    assert await clock.wait_for(asyncio.sleep(0, 3), 1.0) == 3
    task = asyncio.create_task(clock.wait_for(value(), 2.0))
    await clock.settle()  # the task starts, its deadline is 2 s from now
    await clock.advance_and_settle(2.0)
    with pytest.raises(TimeoutError):
        await task
    gate.set()
    assert await clock.wait_for(value(), None) == 7


async def test_a_zero_deadline_expires_at_once() -> None:
    clock = FakeClock()
    with pytest.raises(TimeoutError):
        async with clock.timeout(0):
            await asyncio.Event().wait()


async def test_an_outer_cancel_is_a_cancel_not_a_timeout() -> None:
    clock = FakeClock()

    async def inner() -> None:
        async with clock.timeout(10.0):
            await asyncio.Event().wait()

    task = asyncio.create_task(inner())
    await clock.settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_settle_runs_a_chain_of_wakeups_to_the_end() -> None:
    clock = FakeClock()
    hops: list[int] = []

    async def chain(n: int) -> None:
        hops.append(n)
        if n < 50:
            await asyncio.create_task(chain(n + 1))

    task = asyncio.create_task(chain(0))
    await clock.settle()
    assert hops == list(range(51)) and task.done()


@pytest.mark.parametrize("clock", [SystemClock()])
async def test_the_system_clock_deadlines_are_asyncio_s(clock: Clock) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with clock.timeout(0.01):
            await asyncio.Event().wait()
    with pytest.raises(TimeoutError):
        await clock.wait_for(asyncio.Event().wait(), 0.01)
    assert await clock.wait_for(asyncio.sleep(0, "x"), 1.0) == "x"
    assert time.monotonic() - started < 5.0
