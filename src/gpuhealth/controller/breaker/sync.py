"""Keeps the circuit breaker stored in its ConfigMap while this replica leads.

On taking the lead the stored state is adopted: a breaker opened by the previous leader
stays open, and the nodes it admitted within the window still count against the budget (a
restarted or crash-looping controller gets no fresh budget). Afterwards every trip, reset
and newly admitted node is written back within ``sync_interval_s``, and while the breaker is
open the ConfigMap is re-read so that an operator can close it with ``kubectl``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.store import MAX_WINDOW, StoredBreaker, WindowEntry
from gpuhealth.controller.kube.rest import KubeError, NotFoundError, PermanentKubeError

log = get_logger("breaker")


class BreakerStorage(Protocol):
    async def load(self) -> StoredBreaker | None: ...

    async def save(self, state: StoredBreaker) -> None: ...


class Resettable(Protocol):
    """The hard-write gate (``gpuhealth.controller.breaker.gate.WriteGate``)."""

    def reset(self, *, by: str) -> list[str]: ...


def stored_state(b: CircuitBreaker) -> StoredBreaker:
    window = tuple(WindowEntry(node=n, at=at.isoformat()) for n, at in b.window())
    return StoredBreaker(
        window=window[-MAX_WINDOW:],
        open=b.is_open,
        trips=b.trips,
        tripped_at=b.tripped_at.isoformat() if b.tripped_at else "",
        message="new hard taints blocked; reset: docs/operations.md#circuit-breaker"
        if b.is_open
        else "",
    )


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


class BreakerSync:
    """One leadership term of the breaker's stored state: :meth:`adopt` before the reconciler
    starts, then :meth:`run` beside it."""

    def __init__(
        self, breaker: CircuitBreaker, store: BreakerStorage, owner: Resettable, clock: Clock
    ) -> None:
        self._breaker = breaker
        self._store = store
        self._owner = owner
        self._clock = clock
        self._saved = -1
        """The breaker version known to be in the store (-1: unknown, write it)."""

    async def adopt(self) -> None:
        """Take the stored state: a breaker opened by the previous leader stays open. What was
        read is what is stored, so it is not written back (an operator closing the breaker
        right after a failover is not overwritten)."""
        b = self._breaker
        try:
            stored = await self._store.load()
        except KubeError as exc:
            log.warning("circuit_breaker_state_unreadable", error=str(exc))
            return
        known: set[str] = set()
        if stored is not None:
            entries = [(e.node, t) for e in stored.window if (t := _parse_time(e.at)) is not None]
            known = {n for n, _ in entries}
            b.restore_window(entries)
            if entries:
                log.info("circuit_breaker_window_adopted", nodes=len(b.window()))
        if stored is not None and stored.open:
            b.restore(is_open=True, trips=stored.trips, tripped_at=_parse_time(stored.tripped_at))
            log.error("CIRCUIT_BREAKER_OPEN: adopted from the previous leader", trips=stored.trips)
        elif b.is_open:
            return  # opened here, closed (or absent) there: written by run()
        if {n for n, _ in b.window()} <= known:
            self._saved = b.version  # nothing here the store lacks

    async def run(self) -> None:
        """Until cancelled: write every trip and reset; while open, re-read the store every
        ``poll_interval_s`` and close the breaker when an operator closed it there."""
        b, settings, clock = self._breaker, self._breaker.settings, self._clock
        last_read = clock.monotonic()
        while True:
            await clock.sleep(settings.sync_interval_s)
            try:
                if b.version != self._saved:
                    version = b.version
                    await self._store.save(stored_state(b))
                    self._saved = version
                elif b.is_open and clock.monotonic() - last_read >= settings.poll_interval_s:
                    last_read = clock.monotonic()
                    stored = await self._store.load()
                    if stored is not None and not stored.open:
                        log.warning("circuit_breaker_closed_by_configmap")
                        self._owner.reset(by="configmap")
            except (PermanentKubeError, NotFoundError) as exc:
                log.warning("circuit_breaker_state_not_persisted", error=str(exc))
                self._saved = b.version
            except KubeError as exc:
                log.warning("circuit_breaker_state_sync_failed", error=str(exc))
