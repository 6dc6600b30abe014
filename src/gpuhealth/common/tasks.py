"""Named, supervised background tasks with restart backoff and clean shutdown.

A crashed task is restarted after the project's one backoff (:mod:`gpuhealth.common.backoff`);
a run that lasted :attr:`RestartPolicy.stable_after_s` before it crashed starts the count
again, so a task that crashes now and then always waits the first delay. A task that ended
(returned, or crashed without restart) is not healthy: :meth:`Supervisor.healthy` is False and
``/healthz`` says so.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpuhealth.common.backoff import Backoff, Rand, backoff_delay
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger

log = get_logger("tasks")

TaskFactory = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Exponential backoff between restarts of a crashed task."""

    initial_s: float = 0.5
    """First delay before restarting a crashed task."""
    max_s: float = 30.0
    """Longest delay between restarts, however many crashes came before."""
    factor: float = 2.0
    """Growth of the delay per consecutive crash."""
    jitter: float = 0.2
    """Random spread around each delay, as a fraction of it."""
    stable_after_s: float = 60.0
    """A run that lasted this long before it crashed was stable: the next restart waits the
    first delay again (the crash count of :meth:`Supervisor.status` keeps counting)."""

    def delay(self, attempt: int, rand: Rand = random.random) -> float:
        """Delay before restart ``attempt`` (1-based); any attempt number, never overflows."""
        return backoff_delay(self, attempt, rand)


@dataclass
class _Supervised:
    name: str
    factory: TaskFactory
    restart: bool
    task: asyncio.Task[None] | None = None
    failures: int = 0
    last_error: str | None = None
    running: bool = False
    ended: bool = False
    """The task returned, or crashed without restart: it will not run again."""


@dataclass
class Supervisor:
    """Runs coroutines as named tasks; a crash is logged, counted and restarted with backoff.

    ``on_failure(name, exc)`` lets the owner export a metric or mark a source unhealthy.
    """

    clock: Clock = field(default_factory=SystemClock)
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    on_failure: Callable[[str, BaseException], None] | None = None
    rand: Rand = random.random
    """The backoff's random source (tests pin it)."""
    _tasks: dict[str, _Supervised] = field(default_factory=dict)
    _closing: bool = False

    def start(self, name: str, factory: TaskFactory, *, restart: bool = True) -> None:
        if name in self._tasks:
            raise ValueError(f"task {name!r} already supervised")
        sup = _Supervised(name=name, factory=factory, restart=restart)
        self._tasks[name] = sup
        sup.task = asyncio.create_task(self._run(sup), name=name)

    async def _run(self, sup: _Supervised) -> None:
        backoff = Backoff(self.policy, self.rand, stable_after_s=self.policy.stable_after_s)
        while not self._closing:
            sup.running = True
            started = self.clock.monotonic()
            try:
                await sup.factory()
            except asyncio.CancelledError:
                sup.running = False
                raise
            except Exception as exc:
                sup.running = False
                delay = backoff.after_run(self.clock.monotonic() - started)
                sup.failures += 1
                sup.last_error = f"{type(exc).__name__}: {exc}"
                log.error("task_crashed", task=sup.name, attempt=backoff.attempt, exc_info=exc)
                if self.on_failure is not None:
                    self.on_failure(sup.name, exc)
                if not sup.restart:
                    sup.ended = True
                    return
                await self.clock.sleep(delay)
            else:
                sup.running = False
                sup.ended = True
                log.warning("task_ended", task=sup.name)
                return

    def status(self) -> dict[str, dict[str, object]]:
        return {
            n: {
                "running": s.running,
                "ended": s.ended,
                "failures": s.failures,
                "last_error": s.last_error,
            }
            for n, s in self._tasks.items()
        }

    def healthy(self) -> bool:
        """Every task is running: one waiting to restart after a crash, or one that ended
        (returned, or crashed without restart), is not."""
        return all(s.running for s in self._tasks.values())

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait for them (bounded), in reverse start order."""
        self._closing = True
        tasks = [s.task for s in reversed(self._tasks.values()) if s.task is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        self._tasks.clear()
        self._closing = False
