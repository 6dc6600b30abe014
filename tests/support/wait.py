"""Wait for a condition with a deadline: the one polling helper of the test suite.

Use it only where something outside the test's control makes progress (a real socket, a
subprocess, a thread, the API server). Where the test owns the clock, advance a ``FakeClock``
instead; where it owns the code, wait on an ``asyncio.Event``. Never assert that "nothing
happened" after a fixed sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], T | Awaitable[T | None] | None],
    what: str = "the condition",
    *,
    timeout_s: float = 15.0,
    interval_s: float = 0.01,
) -> T:
    """Call ``check`` (plain or async) until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` when ``timeout_s`` passes first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(interval_s)


def until_sync(
    check: Callable[[], T | None],
    what: str = "the condition",
    *,
    timeout_s: float = 15.0,
    interval_s: float = 0.05,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """The blocking form of :func:`until`, for tests without an event loop (subprocesses).

    ``diagnostics`` is called on timeout and its text appended to the failure (e.g. logs).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{diagnostics()}" if diagnostics is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}{extra}")
        time.sleep(interval_s)
