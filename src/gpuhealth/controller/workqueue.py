"""A deduplicating work queue keyed by name, with per-key exponential backoff (client-go style),
and the one worker loop that drains it.

A key is queued at most once; a key being processed is never handed to a second worker: if
it is added meanwhile it is queued again when the first worker calls :meth:`done`. Keys that
keep failing are re-added after ``base x 2^failures`` (capped, the project's one backoff,
:mod:`gpuhealth.common.backoff`) through :meth:`add_after_failure`.
:func:`run_worker` is the loop every queue consumer runs (the reconciler's node and status
workers, DRA device taints): take a key, handle it, forget its backoff on success, requeue it
after its backoff on failure, mark it done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from gpuhealth.common.backoff import capped_exponential
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger

log = get_logger("workqueue")

KeyHandler = Callable[[str], Awaitable[bool]]
"""Handles one key: True when done, False when it must be retried after its backoff (e.g. a
device not published yet); an exception is a failure, retried after its backoff too."""


class WorkQueue:
    def __init__(
        self,
        clock: Clock | None = None,
        *,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 30.0,
        name: str = "queue",
    ) -> None:
        self._clock = clock or SystemClock()
        self._ready: asyncio.Queue[str] = asyncio.Queue()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: set[asyncio.Task[None]] = set()
        self._base = backoff_base_s
        self._max = backoff_max_s
        self.name = name

    def add(self, key: str) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.put_nowait(key)

    async def get(self) -> str:
        key = await self._ready.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._ready.put_nowait(key)

    def __len__(self) -> int:
        return len(self._dirty)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def backoff(self, key: str) -> float:
        return capped_exponential(self._failures.get(key, 0) + 1, self._base, self._max, 2.0)

    def add_after_failure(self, key: str) -> float:
        """Requeue ``key`` after its backoff; returns the delay."""
        delay = self.backoff(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: its next failure starts from the base delay again."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        task = asyncio.create_task(self._later(key, delay_s), name=f"{self.name}-requeue-{key}")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _later(self, key: str, delay_s: float) -> None:
        await self._clock.sleep(delay_s)
        self.add(key)

    async def close(self) -> None:
        """Cancel pending delayed re-adds."""
        timers = list(self._timers)
        for t in timers:
            t.cancel()
        for t in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def run_worker(
    queue: WorkQueue, handle: KeyHandler, *, failure_event: str, key_field: str = "node"
) -> None:
    """Drain ``queue`` with ``handle`` until cancelled (run several for concurrency).

    A key whose handler returns True has its backoff forgotten; one that returns False or
    raises is requeued after its backoff (a raise is logged as ``failure_event`` with the key
    under ``key_field``, the error and the delay). The key is marked done either way, so a
    key added while it was being handled comes back.

    The worker yields to the event loop after every key: a key handled without suspending
    (nothing to write) finishes without giving the loop back, and after a storm at 19,000
    nodes a worker went through keys like that for over a second in one turn of the loop.
    """
    while True:
        key = await queue.get()
        try:
            if await handle(key):
                queue.forget(key)
            else:
                queue.add_after_failure(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            delay = queue.add_after_failure(key)
            log.warning(failure_event, **{key_field: key}, error=str(exc), retry_in_s=delay)
        finally:
            queue.done(key)
        await asyncio.sleep(0)
