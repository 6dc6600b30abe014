"""Keeps the circuit breaker's state in its ConfigMap while this replica leads.

On taking the lead the stored state is adopted (a breaker opened by the previous leader
stays open). Afterwards every trip and reset is written back, and while the breaker is open
the ConfigMap is re-read so that an operator can close it with ``kubectl``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker import CircuitBreaker
from gpuhealth.controller.kube.breaker_store import StoredBreaker
from gpuhealth.controller.kube.rest import KubeError, NotFoundError, PermanentKubeError

log = get_logger("breaker")


class StateStore(Protocol):
    async def load(self) -> StoredBreaker | None: ...

    async def save(self, state: StoredBreaker) -> None: ...


class Resettable(Protocol):
    def reset_breaker(self) -> list[str]: ...


def stored_state(b: CircuitBreaker) -> StoredBreaker:
    return StoredBreaker(
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


async def adopt(breaker: CircuitBreaker, store: StateStore) -> None:
    try:
        stored = await store.load()
    except KubeError as exc:
        log.warning("circuit_breaker_state_unreadable", error=str(exc))
        return
    if stored is not None and stored.open:
        breaker.restore(is_open=True, trips=stored.trips, tripped_at=_parse_time(stored.tripped_at))
        log.error("CIRCUIT_BREAKER_OPEN: adopted from the previous leader", trips=stored.trips)


async def sync(breaker: CircuitBreaker, store: StateStore, owner: Resettable, clock: Clock) -> None:
    """Run while leading (after :func:`adopt`)."""
    settings = breaker.settings
    saved = breaker.version if not breaker.is_open else -1
    last_read = clock.monotonic()
    while True:
        await clock.sleep(settings.sync_interval_s)
        try:
            if breaker.version != saved:
                version = breaker.version
                await store.save(stored_state(breaker))
                saved = version
            elif breaker.is_open and clock.monotonic() - last_read >= settings.poll_interval_s:
                last_read = clock.monotonic()
                stored = await store.load()
                if stored is not None and not stored.open:
                    log.warning("circuit_breaker_closed_by_configmap")
                    owner.reset_breaker()
        except (PermanentKubeError, NotFoundError) as exc:
            log.warning("circuit_breaker_state_not_persisted", error=str(exc))
            saved = breaker.version
        except KubeError as exc:
            log.warning("circuit_breaker_state_sync_failed", error=str(exc))
