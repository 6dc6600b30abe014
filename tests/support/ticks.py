"""Turns of the event loop another task gets: how a test shows that code yields."""

from __future__ import annotations

import asyncio


class Ticks:
    """Turns of the event loop another task got while this one was inside the block
    (``n``, counted from 0 at entry)."""

    def __init__(self) -> None:
        self.n = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.n += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> Ticks:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        self.n = 0
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
