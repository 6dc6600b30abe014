"""Leader election with a ``coordination.k8s.io`` Lease, as client-go's leaderelection does it.

Only the leader writes: ``work`` (the reconciler, DRA, ...) runs while this replica holds the
Lease. The loop never gives up and never crashes on API errors (an API-server outage is
expected weather):

- *acquire*: every ``retry_period_s`` read the Lease; take it when it is free, ours, or its
  holder has not renewed it for ``leaseDurationSeconds`` as observed on this replica's own
  monotonic clock (clocks of different machines are never compared); the write is guarded by
  the resourceVersion, so of two replicas racing for it one wins.
- *hold*: renew every ``retry_period_s``; each attempt is bounded by ``request_timeout_s`` and
  by what is left of ``renew_deadline_s`` since the last successful renewal. The leader first
  writes the Lease as it last saw it (one request, guarded by that resourceVersion: client-go's
  fast path), and reads it first only when that write fails: under load (an API server
  answering 19,000 agents' TokenReviews) a renewal costs one round trip instead of two. When
  ``renew_deadline_s`` passes without a renewal, or the Lease shows another holder, this
  replica *loses* the lead: it stops acting at once (``is_leader`` goes false first, so the
  hard-write gate refuses, then the work is cancelled), logs ``lost_leadership``, counts
  ``gpuhealth_controller_leadership_lost_total``, and campaigns again. ``renew_deadline_s`` is
  shorter than the lease duration, so it stops before anyone else may start.

On a clean shutdown the leader clears the holder so that the other replica takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.lease import LeaseRecord, micro_time
from gpuhealth.controller.kube.rest import ConflictError, KubeError
from gpuhealth.controller.leadership.settings import LeaderSettings

log = get_logger("leader")

Work = Callable[[], Awaitable[None]]
WORK_RESTART_S = 1.0
"""Pause before re-running leader work that crashed while this replica still leads."""


class LeaseStore(Protocol):
    """The Lease on the API server (:class:`gpuhealth.controller.kube.lease.LeaseClient`)."""

    async def get(self, *, timeout_s: float) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord: ...


class Attempt(Enum):
    HELD = "held"
    """We hold the Lease now."""
    TAKEN = "taken"
    """Another replica holds it and has renewed it recently."""
    FAILED = "failed"
    """The API server could not be asked, or answered an error (retry)."""


class LeaderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.lost = Counter(
            "gpuhealth_controller_leadership_lost",
            "Times this replica stopped leading because it could not renew the Lease in time "
            "or saw another holder",
            registry=registry,
        )
        self.lease_errors = Counter(
            "gpuhealth_controller_lease_errors",
            "Lease requests that failed (API server unreachable, timeouts, errors)",
            registry=registry,
        )


class LeaderElector:
    def __init__(
        self,
        lease: LeaseStore,
        settings: LeaderSettings,
        identity: str,
        work: Work,
        *,
        clock: Clock | None = None,
        metrics: LeaderMetrics | None = None,
        observed: tuple[LeaseRecord, float] | None = None,
    ) -> None:
        """``observed``: the Lease as this replica already watched it (the record, and the
        monotonic time it last saw it change): a campaign for a Lease seen unrenewed for its
        duration takes it at once instead of watching it that long again."""
        self._lease = lease
        self.settings = settings
        self.identity = identity
        self._work = work
        self._clock = clock or SystemClock()
        self.metrics = metrics or LeaderMetrics(None)
        self.is_leader = False
        self.transitions = 0
        """Times this replica took the lead."""
        self.losses = 0
        """Times it lost the lead (renew deadline passed, or another holder seen)."""
        self.holder = ""
        """The holder this replica last saw in the Lease (for people: who leads)."""
        self._holding = False
        """Holds the Lease as far as this replica knows (outlives the work on shutdown)."""
        self._seen: LeaseRecord | None = observed[0] if observed else None
        self._seen_at = observed[1] if observed else 0.0
        """Monotonic time the Lease was last seen to change (another holder's renewals)."""
        self._failing = 0
        self._retired = False

    def retire(self) -> None:
        """Shutting down: the lead is kept while it lasts (given up at the end, :meth:`release`)
        but never taken again once lost. At 19,000 agents the streams' drain held the event
        loop past the renew deadline, and the stopping replica took the lead back and started
        the leader work again on its way out (bench ``fleet_scale``)."""
        self._retired = True

    async def run(self) -> None:
        if not self.settings.enabled:
            self.is_leader = True
            self.transitions += 1
            await self._lead()
            return
        while True:
            await self._acquire()
            await self._hold()

    # -- campaign -----------------------------------------------------------------------------

    async def _acquire(self) -> None:
        s = self.settings
        while self._retired or await self._attempt(s.request_timeout_s) is not Attempt.HELD:
            await self._clock.sleep(s.retry_period_s)

    async def _hold(self) -> None:
        s, clock = self.settings, self._clock
        self.is_leader = True
        self._holding = True
        self.transitions += 1
        log.info("leading", identity=self.identity, transitions=self.transitions)
        work = asyncio.create_task(self._lead(), name="leader-work")
        renewed = clock.monotonic()
        reason = ""
        try:
            while not reason:
                await clock.sleep(s.retry_period_s)
                left = renewed + s.renew_deadline_s - clock.monotonic()
                if left <= 0:
                    reason = "renew_deadline_passed"
                    break
                result = await self._attempt(min(s.request_timeout_s, left))
                if result is Attempt.HELD:
                    renewed = clock.monotonic()
                elif result is Attempt.TAKEN:
                    reason = "another_holder"
        finally:
            # stop acting first: the hard-write gate reads is_leader
            self.is_leader = False
            if reason:
                self._holding = False
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        self.losses += 1
        self.metrics.lost.inc()
        log.error(
            "lost_leadership",
            identity=self.identity,
            reason=reason,
            holder=self.holder,
            renew_deadline_s=s.renew_deadline_s,
        )

    async def _attempt(self, timeout_s: float) -> Attempt:
        """One read and, when allowed, one write of the Lease; never raises on API errors."""
        try:
            async with self._clock.timeout(timeout_s):
                if self._holding and await self._renew_as_seen(timeout_s):
                    return self._recovered(Attempt.HELD)
                record = await self._lease.get(timeout_s=timeout_s)
                now = self._clock.now()
                if record is None:
                    fresh = LeaseRecord(
                        holder=self.identity,
                        duration_s=self.settings.lease_duration_s,
                        acquire_time=micro_time(now),
                        renew_time=micro_time(now),
                    )
                    self._observe(await self._lease.create(fresh, timeout_s=timeout_s))
                    return self._recovered(Attempt.HELD)
                self._observe(record)
                if record.holder and record.holder != self.identity and not self._expired(record):
                    return self._recovered(Attempt.TAKEN)
                ours = record.holder == self.identity
                claim = LeaseRecord(
                    holder=self.identity,
                    duration_s=self.settings.lease_duration_s,
                    acquire_time=record.acquire_time if ours else micro_time(now),
                    renew_time=micro_time(now),
                    transitions=record.transitions + (0 if ours else 1),
                    resource_version=record.resource_version,
                )
                self._observe(await self._lease.update(claim, timeout_s=timeout_s))
                return self._recovered(Attempt.HELD)
        except ConflictError:
            return Attempt.FAILED  # someone else wrote first; read again next time
        except (KubeError, TimeoutError, OSError) as exc:
            self.metrics.lease_errors.inc()
            self._failing += 1
            if self._failing == 1:
                log.warning("lease_unreachable", identity=self.identity, error=str(exc))
            return Attempt.FAILED

    async def _renew_as_seen(self, timeout_s: float) -> bool:
        """Renew the Lease as this replica last saw it holding it, without reading it first;
        False when that write failed (someone wrote it since, or the request failed): the
        caller reads it and decides."""
        seen = self._seen
        if seen is None or seen.holder != self.identity:
            return False
        renewed = dataclasses.replace(
            seen,
            duration_s=self.settings.lease_duration_s,
            renew_time=micro_time(self._clock.now()),
        )
        try:
            self._observe(await self._lease.update(renewed, timeout_s=timeout_s))
        except ConflictError:
            return False
        except (KubeError, OSError) as exc:
            self.metrics.lease_errors.inc()
            log.info("lease_renewal_write_failed", identity=self.identity, error=str(exc))
            return False
        return True

    def _recovered(self, result: Attempt) -> Attempt:
        if self._failing:
            log.info("lease_reachable", identity=self.identity, failed_attempts=self._failing)
            self._failing = 0
        return result

    def _observe(self, record: LeaseRecord) -> None:
        if self._seen is None or record != self._seen:
            self._seen = record
            self._seen_at = self._clock.monotonic()
        self.holder = record.holder

    def _expired(self, record: LeaseRecord) -> bool:
        """No renewal seen for the holder's lease duration (on this replica's clock)."""
        duration = record.duration_s or self.settings.lease_duration_s
        return self._clock.monotonic() >= self._seen_at + duration

    # -- the work -----------------------------------------------------------------------------

    async def _lead(self) -> None:
        while True:
            try:
                await self._work()
                return
            except Exception:
                log.exception("leader_work_crashed")
                await self._clock.sleep(WORK_RESTART_S)

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) if this replica holds it."""
        if not self.settings.enabled or not self._holding:
            return
        self.is_leader = False
        self._holding = False
        timeout_s = self.settings.request_timeout_s
        with contextlib.suppress(KubeError, TimeoutError, OSError):
            async with self._clock.timeout(timeout_s):
                record = await self._lease.get(timeout_s=timeout_s)
                if record is None or record.holder != self.identity:
                    return
                released = LeaseRecord(
                    holder="",
                    duration_s=1,
                    acquire_time=record.acquire_time,
                    renew_time=record.renew_time,
                    transitions=record.transitions,
                    resource_version=record.resource_version,
                )
                await self._lease.update(released, timeout_s=timeout_s)
                log.info("lease_released", identity=self.identity)
