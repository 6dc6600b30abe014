"""Keeps the circuit breaker stored in its ConfigMap while this replica leads.

On taking the lead the stored state is loaded before any leader work starts
(:meth:`BreakerSync.adopt`, in ``LeaderWork``'s prepare): a read that fails (403 while the
successor's RBAC is not there yet, 5xx, a timeout) is retried with the one backoff
(``breaker.load_backoff_s`` doubling up to ``breaker.load_backoff_max_s``), logged
(``circuit_breaker_load_failed``) and counted (``gpuhealth_circuit_breaker_load_errors_total``);
meanwhile the leader is not ready (``/readyz`` 503, the gate allows no hard write) and nothing
is written to the ConfigMap. A 404 is a successful read of "nothing stored yet".

The load never loosens the breaker: a breaker (the fleet's or a pool's) opened by the previous
leader stays open, one opened here stays open whatever is stored, and the window is the union
of the stored entries and those in memory (each node counted from its latest admission, against
the fleet's and its pool's budgets), so a restarted or crash-looping controller gets no fresh
budget. Afterwards every trip, reset and newly admitted
node is written back within ``sync_interval_s``, and while the breaker (or a pool's) is open the
ConfigMap is re-read so that an operator can close it with ``kubectl`` (``state: closed``
closes the fleet and every pool).
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.backoff import Backoff, BackoffPolicy, Rand
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.gate import CircuitBreaker, PoolTrip
from gpuhealth.controller.breaker.store import MAX_WINDOW, OpenPool, StoredBreaker, WindowEntry
from gpuhealth.controller.kube.rest import KubeError, NotFoundError, PermanentKubeError

log = get_logger("breaker")

LOAD_JITTER = 0.2
"""Random spread of the pause after a failed load, as a fraction of it."""


class BreakerStorage(Protocol):
    async def load(self) -> StoredBreaker | None: ...

    async def save(self, state: StoredBreaker) -> None: ...


class Resettable(Protocol):
    """The hard-write gate (``gpuhealth.controller.breaker.gate.WriteGate``)."""

    def reset(self, *, by: str) -> list[str]: ...


class BreakerSyncMetrics:
    """``gpuhealth_circuit_breaker_load_errors_total{status}``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.load_errors = Counter(
            "gpuhealth_circuit_breaker_load_errors",
            "A new leader's reads of the breaker's ConfigMap that failed, by HTTP status "
            "(none: no answer); retried with backoff before any leader work starts",
            ["status"],
            registry=registry,
        )


def stored_state(b: CircuitBreaker) -> StoredBreaker:
    window = tuple(
        WindowEntry(node=n, at=at.isoformat(), pool=b.admitted_pool(n)) for n, at in b.window()
    )
    if len(window) > MAX_WINDOW:  # only a union of two leaders' windows grows past the budget
        log.warning("circuit_breaker_window_cut", entries=len(window), kept=MAX_WINDOW)
    pools = tuple(
        OpenPool(
            pool=pool,
            tripped_at=trip.tripped_at.isoformat() if trip.tripped_at else "",
            trips=trip.trips,
        )
        for pool, trip in sorted(b.open_pools.items())
    )
    blocked = "new hard taints blocked"
    if not b.is_open and pools:
        blocked += " in pool(s) " + ", ".join(p.pool for p in pools)
    return StoredBreaker(
        window=window[-MAX_WINDOW:],
        open=b.is_open,
        trips=b.trips,
        tripped_at=b.tripped_at.isoformat() if b.tripped_at else "",
        message=f"{blocked}; reset: docs/operations.md#circuit-breaker" if b.any_open else "",
        pools=pools,
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
        self,
        breaker: CircuitBreaker,
        store: BreakerStorage,
        owner: Resettable,
        clock: Clock,
        *,
        metrics: BreakerSyncMetrics | None = None,
        rand: Rand = random.random,
    ) -> None:
        self._breaker = breaker
        self._store = store
        self._owner = owner
        self._clock = clock
        self.metrics = metrics or BreakerSyncMetrics(None)
        self._rand = rand
        self._saved = -1
        """The breaker version known to be in the store (-1: unknown, write it)."""
        self.loaded = False
        """The stored state was read in this leadership term: only then may it be written."""

    async def adopt(self) -> None:
        """Read the stored state until a read succeeds, then take it: a breaker opened by the
        previous leader stays open, the window is the union of both. What was read is what is
        stored, so it is not written back (an operator closing the breaker right after a
        failover is not overwritten)."""
        self.loaded = False
        stored = await self._load_until_read()
        b = self._breaker
        known: set[str] = set()
        known_pools: set[str] = set()
        if stored is not None:
            entries = [(e.node, t) for e in stored.window if (t := _parse_time(e.at)) is not None]
            known = {n for n, _ in entries}
            b.restore_window(entries, {e.node: e.pool for e in stored.window})
            if entries:
                log.info("circuit_breaker_window_adopted", nodes=len(b.window()))
            known_pools = {p.pool for p in stored.pools}
        self.loaded = True
        if stored is not None and stored.any_open:
            b.restore(
                is_open=stored.open,
                trips=stored.trips,
                tripped_at=_parse_time(stored.tripped_at),
                open_pools={
                    p.pool: PoolTrip(_parse_time(p.tripped_at), p.trips) for p in stored.pools
                },
            )
            log.error(
                "CIRCUIT_BREAKER_OPEN: adopted from the previous leader",
                trips=stored.trips,
                fleet=stored.open,
                pools=sorted(known_pools),
            )
        if (b.is_open and not (stored is not None and stored.open)) or set(
            b.open_pools
        ) - known_pools:
            return  # opened here, closed (or absent) there: written by run()
        if {n for n, _ in b.window()} <= known:
            self._saved = b.version  # nothing here the store lacks

    async def _load_until_read(self) -> StoredBreaker | None:
        settings = self._breaker.settings
        backoff = Backoff(
            BackoffPolicy(
                initial_s=settings.load_backoff_s,
                max_s=settings.load_backoff_max_s,
                jitter=LOAD_JITTER,
            ),
            self._rand,
        )
        while True:
            try:
                stored = await self._store.load()
            except KubeError as exc:
                delay = backoff.next_delay()
                self.metrics.load_errors.labels(str(exc.status or "none")).inc()
                log.warning(
                    "circuit_breaker_load_failed",
                    error=str(exc),
                    status=exc.status,
                    attempt=backoff.attempt,
                    retry_in_s=round(delay, 3),
                )
                await self._clock.sleep(delay)
                continue
            if backoff.attempt:
                log.info("circuit_breaker_loaded", failed_attempts=backoff.attempt)
            return stored

    async def run(self) -> None:
        """Until cancelled: write every trip and reset; while open, re-read the store every
        ``poll_interval_s`` and close the breaker when an operator closed it there. Nothing is
        written before the stored state was read (:meth:`adopt` first, if it has not run)."""
        if not self.loaded:
            await self.adopt()
        try:
            await self._keep()
        finally:
            self.loaded = False  # the term ended: the next one reads the store first

    async def _keep(self) -> None:
        b, settings, clock = self._breaker, self._breaker.settings, self._clock
        last_read = clock.monotonic()
        while True:
            await clock.sleep(settings.sync_interval_s)
            try:
                if b.version != self._saved:
                    version = b.version
                    await self._store.save(stored_state(b))
                    self._saved = version
                elif b.any_open and clock.monotonic() - last_read >= settings.poll_interval_s:
                    last_read = clock.monotonic()
                    stored = await self._store.load()
                    if stored is not None and not stored.any_open:
                        log.warning("circuit_breaker_closed_by_configmap")
                        self._owner.reset(by="configmap")
            except (PermanentKubeError, NotFoundError) as exc:
                log.warning("circuit_breaker_state_not_persisted", error=str(exc))
                self._saved = b.version
            except KubeError as exc:
                log.warning("circuit_breaker_state_sync_failed", error=str(exc))
