"""Fan-out of health transitions to listeners and asyncio subscribers.

``publish`` is synchronous and never blocks the engine. A *listener* is called inline (the
stream client's ``publish`` appends to its durable outbox right there, so nothing is lost
between the engine and the disk). A *subscription* is a bounded queue for async consumers;
when it overflows the oldest transition is dropped and ``overflowed`` is set, telling the
subscriber to resynchronise from a full snapshot instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

from gpuhealth.agent.health.transition import Transition
from gpuhealth.common.logging import get_logger

log = get_logger("hub")

DEFAULT_QUEUE_SIZE = 1024
"""Transitions buffered per subscriber before the oldest are dropped."""


class Subscription:
    def __init__(self, hub: TransitionFanout, maxsize: int) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[Transition] = asyncio.Queue(maxsize=maxsize)
        self.overflowed = False
        """Set when transitions were dropped; the subscriber should send a full snapshot
        and clear it."""

    def _put(self, transition: Transition) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.overflowed = True
        self._queue.put_nowait(transition)

    async def get(self) -> Transition:
        return await self._queue.get()

    def get_nowait(self) -> Transition | None:
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        self._hub.unsubscribe(self)

    async def __aiter__(self) -> AsyncIterator[Transition]:
        while True:
            yield await self._queue.get()


class TransitionFanout:
    def __init__(self) -> None:
        self._subscribers: list[Subscription] = []
        self._listeners: list[Callable[[Transition], None]] = []
        self._node_listeners: list[Callable[[], None]] = []

    def add_node_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when the node's own state changes (its node-level conditions,
        a GPU's MIG devices): no GPU transition carries those (the stream sends a Snapshot)."""
        self._node_listeners.append(listener)

    def node_changed(self) -> None:
        for listener in self._node_listeners:
            try:
                listener()
            except Exception:
                log.exception("node_listener_failed")

    def add_listener(self, listener: Callable[[Transition], None]) -> None:
        """Call ``listener(transition)`` inline for every transition; it must not block."""
        self._listeners.append(listener)

    def subscribe(self, maxsize: int = DEFAULT_QUEUE_SIZE) -> Subscription:
        sub = Subscription(self, maxsize)
        self._subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)

    def publish(self, transitions: Iterable[Transition]) -> None:
        for t in transitions:
            for listener in self._listeners:
                try:
                    listener(t)
                except Exception:
                    # One broken consumer must not stop the engine or the other consumers.
                    log.exception("transition_listener_failed", uuid=t.uuid, kind=t.kind)
            for sub in self._subscribers:
                sub._put(t)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)
