"""Injectable time.

Every component takes a :class:`Clock` so that unit tests can drive time with
``tests.support.clock.FakeClock`` instead of sleeping. Deadlines go through the clock too
(:meth:`Clock.timeout`, :meth:`Clock.wait_for` instead of ``asyncio.timeout`` and
``asyncio.wait_for``), so that the time a test moves also expires them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""

    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for ``seconds`` of this clock's time."""

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        """``async with clock.timeout(s):`` the block is cancelled after ``s`` seconds of this
        clock's time and :class:`TimeoutError` raised (``asyncio.timeout``; None: no limit)."""

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        """``aw``'s result, or :class:`TimeoutError` after ``seconds`` of this clock's time
        (``asyncio.wait_for``; None: no limit)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(seconds)

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        return await asyncio.wait_for(aw, seconds)


async def sleep_or_wake(clock: Clock, seconds: float, wake: asyncio.Event) -> None:
    """Return after ``seconds`` on ``clock``, or as soon as ``wake`` is set (left set: the
    caller clears it when it takes the work)."""
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    waiter = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waiter.cancel()
