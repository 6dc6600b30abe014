"""A clock the tests move by hand (the product's :class:`~gpuhealth.common.clock.Clock`)."""

from __future__ import annotations

import asyncio
import heapq
from datetime import UTC, datetime


class FakeClock:
    """A clock that only moves when told to; sleepers wake on :meth:`advance`."""

    def __init__(self, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        self._wall0 = start or datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
        self._mono0 = monotonic_start
        self._t = monotonic_start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = 0

    def monotonic(self) -> float:
        return self._t

    def now(self) -> datetime:
        from datetime import timedelta

        return self._wall0 + timedelta(seconds=self._t - self._mono0)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._counter += 1
        heapq.heappush(self._sleepers, (self._t + seconds, self._counter, fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._t += seconds
        while self._sleepers and self._sleepers[0][0] <= self._t:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    async def advance_and_settle(self, seconds: float, *, steps: int = 10) -> None:
        """Advance, then yield to the loop so woken tasks can run."""
        self.advance(seconds)
        for _ in range(steps):
            await asyncio.sleep(0)

    @property
    def pending_sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())
