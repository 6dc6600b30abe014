"""One GPU as the NVML source keeps it between polls (:class:`NvmlGpu`; :class:`GpuLost` when
NVML says it is lost), and the thread its NVML calls run in.

**Threads.** NVML calls run off the event loop: one daemon thread per GPU (and one for system
calls, :class:`CallThread`). A thread runs the calls submitted to it in order. Daemon threads,
unlike ThreadPoolExecutor's: an NVML call that never returns must not keep the agent from
exiting. The event loop awaits a call with :func:`await_call`, which can time out without
cancelling the call (NVML calls cannot be cancelled); the late result or error of an abandoned
call is consumed quietly.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuhealth.agent.observations import GpuIdentity, GpuSample, MigDevice

T = TypeVar("T")


class CallThread:
    """One daemon thread running submitted calls in order."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._q.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._q.put(None)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end (after :meth:`stop`)."""
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while (item := self._q.get()) is not None:
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


def await_call(fut: Future[T]) -> asyncio.Future[T]:
    """An awaitable for a thread's call that a timeout does not cancel."""
    afut = asyncio.wrap_future(fut)
    afut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return asyncio.shield(afut)


@dataclass(slots=True)
class NvmlGpu:
    """One GPU as the NVML source keeps it between polls."""

    index: int
    handle: Any
    identity: GpuIdentity
    slowdown_c: float | None
    shutdown_c: float | None
    links: tuple[int, ...]
    unsupported: set[str] = field(default_factory=set)
    """Calls that answered NOT_SUPPORTED: not asked again."""
    thread: CallThread | None = None
    pending: Future[GpuSample] | None = None
    """A sample read that passed its deadline and has not returned yet."""
    unhealthy: bool = False
    nvlink_cache: tuple[int | None, int | None, int | None] = (None, None, None)
    process_ts: int = 0
    reset_required: bool = False
    """A call of the current read answered NVML_ERROR_RESET_REQUIRED."""
    mig_on: bool | None = None
    """MIG mode at the last poll (a change re-probes every NOT_SUPPORTED call)."""
    mig_checked: float = 0.0
    """When MIG mode was last asked although it had answered NOT_SUPPORTED (monotonic)."""
    mig_slots: dict[int, tuple[Any, MigDevice]] = field(default_factory=dict)
    """MIG slot -> (handle key, the instance's static identity)."""


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST."""
