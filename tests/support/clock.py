"""A clock the tests move by hand (the product's :class:`~gpuhealth.common.clock.Clock`).

Sleeps *and* deadlines (:meth:`FakeClock.timeout`, :meth:`FakeClock.wait_for`) follow it: a
test advances the clock past a deadline and the block is cancelled with ``TimeoutError``,
as with the system clock, without any real time passing. :meth:`FakeClock.settle` runs the
event loop until every task woken is blocked again, instead of a guessed number of yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import TypeVar

T = TypeVar("T")

SETTLE_MAX_TURNS = 10_000
"""A loop that never goes quiet within this many turns is a bug in the test (a busy task)."""


async def settle() -> None:
    """Run the event loop until nothing is ready to run: every task woken (by
    :meth:`FakeClock.advance`, an event, a finished task) has run until it waits again. Work in
    threads, subprocesses or sockets is outside it: wait for that with
    ``tests.support.wait.until``."""
    loop = asyncio.get_running_loop()
    ready = loop._ready  # type: ignore[attr-defined]  # the loop's run queue
    for _ in range(SETTLE_MAX_TURNS):
        await asyncio.sleep(0)
        if not ready:
            return
    raise AssertionError(f"the event loop never went quiet in {SETTLE_MAX_TURNS} turns")


class FakeClock:
    """A clock that only moves when told to; sleepers wake and deadlines expire on
    :meth:`advance`."""

    def __init__(self, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        self._wall0 = start or datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
        self._mono0 = monotonic_start
        self._t = monotonic_start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._deadlines: set[asyncio.Future[None]] = set()
        self._counter = 0

    def monotonic(self) -> float:
        return self._t

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=self._t - self._mono0)

    def _at(self, seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._counter += 1
        heapq.heappush(self._sleepers, (self._t + seconds, self._counter, fut))
        return fut

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        await self._at(seconds)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return self._timeout(seconds)

    @contextlib.asynccontextmanager
    async def _timeout(self, seconds: float | None) -> AsyncIterator[object]:
        async with asyncio.timeout(None) as cm:
            if seconds is None:
                yield cm
                return
            loop = asyncio.get_running_loop()

            def expire(_: object) -> None:
                if cm.expired() or cm.when() is not None:
                    return
                cm.reschedule(loop.time())

            if seconds <= 0:
                cm.reschedule(loop.time())
                yield cm
                return
            deadline = self._at(seconds)
            self._deadlines.add(deadline)
            deadline.add_done_callback(lambda f: None if f.cancelled() else expire(f))
            try:
                yield cm
            finally:
                self._deadlines.discard(deadline)
                deadline.cancel()

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        async with self.timeout(seconds):
            return await aw

    def advance(self, seconds: float) -> None:
        """Move time forward: every sleeper whose deadline has passed wakes, every deadline
        passed expires (on the loop's next turns)."""
        self._t += seconds
        while self._sleepers and self._sleepers[0][0] <= self._t:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    async def settle(self) -> None:
        """:func:`settle` (the loop runs until quiet)."""
        await settle()

    async def advance_and_settle(self, seconds: float) -> None:
        """Advance, then :meth:`settle`."""
        self.advance(seconds)
        await self.settle()

    @property
    def pending_sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done() and f not in self._deadlines)
