"""A daemon thread for calls that may hang (a driver call, a sysfs file backed by firmware),
and how the event loop awaits one with a deadline.

A :class:`CallThread` runs the calls submitted to it in order. Daemon threads, unlike
ThreadPoolExecutor's: a call that never returns must not keep the agent from exiting. The event
loop awaits a call with :func:`await_call`, which can time out without cancelling the call
(such calls cannot be cancelled); the late result or error of an abandoned call is consumed
quietly. The NVML source runs one per GPU, the RDMA source one per NIC.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

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
