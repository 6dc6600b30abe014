"""Leader election on a fake clock over an in-memory Lease: an outage costs the lead after the
renew deadline (never a crash), the lead comes back after it, a silent holder is replaced."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from gpuhealth.controller.kube.lease import LeaseRecord
from gpuhealth.controller.kube.rest import ConflictError, TransientKubeError
from gpuhealth.controller.leadership.election import LeaderElector, LeaderMetrics
from gpuhealth.controller.leadership.settings import LeaderSettings
from tests.support.clock import FakeClock

SETTINGS = LeaderSettings(lease_duration_s=15, renew_deadline_s=10.0, retry_period_s=2.0)


class MemoryLease:
    """One Lease with resourceVersions, and an API server that can be down."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.down = False
        self.conflicts = 0
        self.calls: list[str] = []
        self._rv = 0

    def _check(self) -> None:
        if self.down:
            raise TransientKubeError("connection refused", 0)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self._rv += 1
        self.record = dataclasses.replace(record, resource_version=str(self._rv))
        return self.record

    async def get(self, *, timeout_s: float) -> LeaseRecord | None:
        self.calls.append("get")
        self._check()
        return self.record

    async def create(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        self._check()
        if self.record is not None:
            raise ConflictError("exists", 409)
        return self._store(record)

    async def update(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        self.calls.append("update")
        self._check()
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError("conflict", 409)
        assert self.record is not None
        if record.resource_version != self.record.resource_version:
            raise ConflictError("stale", 409)
        return self._store(record)

    def renew_as(self, holder: str) -> None:
        assert self.record is not None
        self._store(dataclasses.replace(self.record, holder=holder, renew_time=f"r{self._rv}"))


class Work:
    def __init__(self) -> None:
        self.running = 0
        self.started = 0
        self.cancelled = 0

    async def __call__(self) -> None:
        self.started += 1
        self.running += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


@pytest.fixture
async def world() -> AsyncIterator[tuple[LeaderElector, MemoryLease, Work, FakeClock]]:
    clock, lease, work = FakeClock(), MemoryLease(), Work()
    el = LeaderElector(lease, SETTINGS, "me", work, clock=clock, metrics=LeaderMetrics())
    task = asyncio.create_task(el.run())
    await clock.advance_and_settle(0)
    yield el, lease, work, clock
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert work.running == 0  # nothing acts after shutdown


async def advance(clock: FakeClock, seconds: float, step: float = 0.5) -> None:
    for _ in range(round(seconds / step)):
        await clock.advance_and_settle(step)


async def test_creates_the_lease_and_leads(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, work, clock = world
    assert el.is_leader and work.running == 1
    assert lease.record is not None and lease.record.holder == "me"
    await advance(clock, 20)
    assert el.is_leader and el.losses == 0 and work.started == 1


async def test_an_outage_costs_the_lead_at_the_renew_deadline_and_it_comes_back(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, work, clock = world
    lease.down = True
    await advance(clock, 9.5)
    assert el.is_leader  # still within the renew deadline (last renewal at t=0)
    await advance(clock, 1.0)
    assert not el.is_leader and work.running == 0 and work.cancelled == 1
    assert el.losses == 1 and el.metrics.lost._value.get() == 1
    assert el.metrics.lease_errors._value.get() >= 4
    await advance(clock, 30)  # a long outage: the elector keeps trying, never crashes
    assert not el.is_leader
    lease.down = False
    await advance(clock, SETTINGS.retry_period_s + 0.5)
    assert el.is_leader and work.running == 1 and el.transitions == 2
    assert lease.record is not None and lease.record.transitions == 0  # it was ours throughout


async def test_a_short_outage_within_the_deadline_keeps_the_lead(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, work, clock = world
    lease.down = True
    await advance(clock, 6)
    lease.down = False
    await advance(clock, 20)
    assert el.is_leader and el.losses == 0 and work.started == 1


async def test_another_holder_in_the_lease_stops_the_work_at_once(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, work, clock = world
    lease.renew_as("other")
    await advance(clock, SETTINGS.retry_period_s + 0.5)
    assert not el.is_leader and work.running == 0 and el.holder == "other"
    for _ in range(5):  # the other keeps renewing: this replica waits
        lease.renew_as("other")
        await advance(clock, 2)
    assert not el.is_leader
    await advance(clock, SETTINGS.lease_duration_s + SETTINGS.retry_period_s)  # it went silent
    assert el.is_leader and lease.record is not None and lease.record.transitions == 1


async def test_conflicts_are_retried() -> None:
    clock, lease, work = FakeClock(), MemoryLease(), Work()
    lease.record = LeaseRecord(holder="", duration_s=1, resource_version="7")
    lease.conflicts = 2
    el = LeaderElector(lease, SETTINGS, "me", work, clock=clock)
    task = asyncio.create_task(el.run())
    await advance(clock, 3 * SETTINGS.retry_period_s)
    assert el.is_leader
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_release_clears_the_holder(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, _, _ = world
    await el.release()
    assert lease.record is not None and lease.record.holder == "" and not el.is_leader


async def test_the_leader_renews_with_one_write_and_reads_only_when_it_fails(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    """client-go's fast path: the Lease written as last seen, guarded by its resourceVersion;
    a renewal costs one request while nobody else touches the Lease."""
    el, lease, work, clock = world
    lease.calls.clear()
    await advance(clock, 10)
    assert lease.calls == ["update"] * 5
    assert lease.record is not None and lease.record.holder == "me"
    assert lease.record.duration_s == SETTINGS.lease_duration_s
    lease.calls.clear()
    lease.conflicts = 1  # written by someone since: read, then write what was read
    await advance(clock, 2)
    assert lease.calls == ["update", "get", "update"]
    assert el.is_leader and el.losses == 0 and work.started == 1
    assert el.metrics.lease_errors._value.get() == 0  # a conflict is no error
    lease.calls.clear()
    lease.down = True  # a failed write is counted, and the read tried in the same attempt
    await advance(clock, 2)
    lease.down = False
    assert lease.calls == ["update", "get"]
    assert el.metrics.lease_errors._value.get() == 2
    await advance(clock, 2)
    assert el.is_leader and el.losses == 0 and lease.calls[-1:] == ["update"]


async def test_a_retired_replica_keeps_its_lead_but_never_takes_it_back(
    world: tuple[LeaderElector, MemoryLease, Work, FakeClock],
) -> None:
    el, lease, work, clock = world
    el.retire()  # shutting down
    await advance(clock, 20)
    assert el.is_leader and work.running == 1  # renewals go on while it stops
    lease.down = True
    await advance(clock, 11)
    assert not el.is_leader and work.running == 0
    lease.down = False
    calls = len(lease.calls)
    await advance(clock, 30)
    assert not el.is_leader and work.started == 1 and el.transitions == 1
    assert len(lease.calls) == calls  # not even an attempt


@pytest.mark.parametrize(
    ("watched_s", "takes_after_s"),
    [
        (None, 15.0),  # nothing watched before: the Lease is watched for its whole duration
        (15.0, 0.0),  # watched unrenewed for its duration already: taken at once
        (10.0, 5.0),  # watched for 10 s: the 5 s left
    ],
)
async def test_a_lease_already_watched_counts_what_was_watched(
    watched_s: float | None, takes_after_s: float
) -> None:
    """A shard's campaign starts with what its replica saw of the Lease (ShardLeases): a
    holder it watched stop renewing loses the Lease after one lease duration, not two."""
    clock, lease, work = FakeClock(), MemoryLease(), Work()
    lease._store(LeaseRecord(holder="gone", duration_s=15, renew_time="r0"))
    assert lease.record is not None
    observed = None
    if watched_s is not None:
        observed = (lease.record, clock.monotonic())
        await advance(clock, watched_s)
    el = LeaderElector(
        lease, SETTINGS, "me", work, clock=clock, metrics=LeaderMetrics(), observed=observed
    )
    task = asyncio.create_task(el.run())
    try:
        await clock.advance_and_settle(0)
        waited = 0.0
        while not el.is_leader:
            await advance(clock, 0.5)
            waited += 0.5
            assert waited <= 20
        assert takes_after_s <= waited <= takes_after_s + SETTINGS.retry_period_s
        assert lease.record is not None and lease.record.holder == "me"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
