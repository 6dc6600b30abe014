"""Named, supervised background tasks with restart backoff and clean shutdown."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger

log = get_logger("tasks")

TaskFactory = Callable[[], Awaitable[None]]


@dataclass
class RestartPolicy:
    """Exponential backoff between restarts of a crashed task."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return base * (1 + random.uniform(-self.jitter, self.jitter))


@dataclass
class _Supervised:
    name: str
    factory: TaskFactory
    restart: bool
    task: asyncio.Task[None] | None = None
    failures: int = 0
    last_error: str | None = None
    running: bool = False


@dataclass
class Supervisor:
    """Runs coroutines as named tasks; a crash is logged, counted and restarted with backoff.

    ``on_failure(name, exc)`` lets the owner export a metric or mark a source unhealthy.
    """

    clock: Clock = field(default_factory=SystemClock)
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    on_failure: Callable[[str, BaseException], None] | None = None
    _tasks: dict[str, _Supervised] = field(default_factory=dict)
    _closing: bool = False

    def start(self, name: str, factory: TaskFactory, *, restart: bool = True) -> None:
        if name in self._tasks:
            raise ValueError(f"task {name!r} already supervised")
        sup = _Supervised(name=name, factory=factory, restart=restart)
        self._tasks[name] = sup
        sup.task = asyncio.create_task(self._run(sup), name=name)

    async def _run(self, sup: _Supervised) -> None:
        attempt = 0
        while not self._closing:
            sup.running = True
            try:
                await sup.factory()
                sup.running = False
                return
            except asyncio.CancelledError:
                sup.running = False
                raise
            except Exception as exc:
                sup.running = False
                attempt += 1
                sup.failures += 1
                sup.last_error = f"{type(exc).__name__}: {exc}"
                log.error("task_crashed", task=sup.name, attempt=attempt, exc_info=exc)
                if self.on_failure is not None:
                    self.on_failure(sup.name, exc)
                if not sup.restart:
                    return
                await self.clock.sleep(self.policy.delay(attempt))

    def status(self) -> dict[str, dict[str, object]]:
        return {
            n: {"running": s.running, "failures": s.failures, "last_error": s.last_error}
            for n, s in self._tasks.items()
        }

    def healthy(self) -> bool:
        return all(
            s.running or (s.task is not None and s.task.done()) for s in self._tasks.values()
        )

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
