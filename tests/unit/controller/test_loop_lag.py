"""The event loop's lag: how much later than due a sleeping task woke, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gpuhealth.controller.loop_lag import watch_loop_lag
from tests.support.clock import FakeClock, settle


async def test_the_time_overslept_is_observed() -> None:
    clock = FakeClock()
    seen: list[float] = []
    task = asyncio.create_task(watch_loop_lag(clock, 0.5, seen.append))
    try:
        await settle()
        clock.advance(0.5)  # on time
        await settle()
        clock.advance(3.0)  # the loop was held: the sleeper woke 2.5 s late
        await settle()
        assert seen == pytest.approx([0.0, 2.5])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
