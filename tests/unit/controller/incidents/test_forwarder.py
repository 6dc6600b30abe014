"""The sending side of the job handoffs (``controller/incidents/forwarder.py``) on a fake clock:
batches, the bound, retries with backoff, wall-clock time on the wire, attempt sets sent per
job and shard when they change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.incidents.blame import JobAttempt, XidOccurrence
from gpuhealth.controller.incidents.forwarder import HandoffForwarder, HandoffLimits, backoff
from gpuhealth.controller.incidents.handoff import (
    ATTEMPTS_PATH,
    REPORTS_PATH,
    AttemptBatch,
    HandoffMetrics,
    XidBatch,
)
from gpuhealth.controller.shards.peers import ShardAnswer
from tests.support.clock import FakeClock

LIMITS = HandoffLimits(
    queue_max=50,
    batch_max=10,
    max_body_bytes=64 << 10,
    backoff_s=0.5,
    backoff_max_s=4.0,
    resend_s=60.0,
    horizon_s=3600.0,
)


class Owners:
    """Other shards' owners as ``ShardPeers.post`` reaches them: each POST recorded, refused
    while ``down``."""

    def __init__(self) -> None:
        self.posts: list[tuple[int, str, bytes]] = []
        self.down: set[int] = set()

    async def post(self, shard: int, path: str, body: bytes) -> ShardAnswer:
        if shard in self.down:
            return ShardAnswer((shard,), None, "no owner published (its Lease is not held)")
        self.posts.append((shard, path, body))
        return ShardAnswer((shard,), {"accepted": 1})

    def reports(self, shard: int | None = None) -> list[XidBatch]:
        return [
            msgspec.json.decode(b, type=XidBatch)
            for s, p, b in self.posts
            if p == REPORTS_PATH and shard in (None, s)
        ]

    def attempts(self) -> list[tuple[int, AttemptBatch]]:
        return [
            (s, msgspec.json.decode(b, type=AttemptBatch))
            for s, p, b in self.posts
            if p == ATTEMPTS_PATH
        ]


NODE_SHARDS = {"node-a": 0, "node-b": 2}


async def node_shard(node: str) -> int | None:
    return NODE_SHARDS.get(node)


def occurrence(clock: FakeClock, i: int, *, ago: float = 0.0, detail: str = "") -> XidOccurrence:
    return XidOccurrence(
        at=clock.monotonic() - ago,
        node=f"node-{i}",
        gpu=f"GPU-{i}",
        xid=13,
        xid_class="app-fault",
        job="ml/JobSet/train",
        pod=f"ml/train-{i}",
        detail=detail,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def owners() -> Owners:
    return Owners()


def make(
    owners: Owners, clock: FakeClock, limits: HandoffLimits = LIMITS
) -> tuple[HandoffForwarder, HandoffMetrics]:
    metrics = HandoffMetrics(CollectorRegistry())
    fwd = HandoffForwarder(owners, limits, clock=clock, metrics=metrics, node_shard=node_shard)
    return fwd, metrics


@pytest.fixture
async def running(owners: Owners, clock: FakeClock) -> AsyncIterator[HandoffForwarder]:
    fwd, _ = make(owners, clock)
    task = asyncio.create_task(fwd.run(), name="shard-handoff")
    yield fwd
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(n, 0.5, 4.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


async def test_reports_go_in_batches_with_their_wall_clock_time(
    owners: Owners, clock: FakeClock
) -> None:
    fwd, metrics = make(owners, clock)
    for i in range(25):
        fwd.report(occurrence(clock, i, ago=30.0), home=1)
    fwd.report(occurrence(clock, 99), home=2)
    assert await fwd.flush()
    assert [len(b.reports) for b in owners.reports(1)] == [10, 10, 5]  # handoff_batch_max
    assert [r.node for b in owners.reports(1) for r in b.reports] == [
        f"node-{i}" for i in range(25)
    ]
    [to_two] = owners.reports(2)
    assert to_two.reports[0].at == clock.now()  # wall time on the wire
    assert owners.reports(1)[0].reports[0].at == clock.now() - timedelta(seconds=30)
    assert fwd.queued == 0
    assert metrics.sent.labels("reports", "sent")._value.get() == 26


async def test_a_batch_stays_within_the_body_bound(owners: Owners, clock: FakeClock) -> None:
    fwd, _ = make(owners, clock, replace(LIMITS, max_body_bytes=4096))
    for i in range(10):
        fwd.report(occurrence(clock, i, detail="x" * 1000), home=1)
    assert await fwd.flush()
    assert all(len(b) <= 4096 for _, _, b in owners.posts)
    assert sum(len(b.reports) for b in owners.reports()) == 10 and len(owners.posts) > 2


async def test_full_queue_drops_and_counts(owners: Owners, clock: FakeClock) -> None:
    fwd, metrics = make(owners, clock)
    owners.down.add(1)
    for i in range(60):
        fwd.report(occurrence(clock, i), home=1)
    assert fwd.queued == 50  # handoff_queue_max
    assert metrics.sent.labels("reports", "dropped")._value.get() == 10
    assert not await fwd.flush()
    assert metrics.sent.labels("reports", "failed")._value.get() == 10  # one batch tried


async def test_a_refused_post_is_retried_with_backoff_nothing_lost(
    owners: Owners, clock: FakeClock, running: HandoffForwarder
) -> None:
    owners.down.add(1)
    for i in range(3):
        running.report(occurrence(clock, i), home=1)
    await clock.settle()
    assert owners.posts == [] and running.failures == 1
    await clock.advance_and_settle(0.5)  # first backoff
    assert running.failures == 2
    await clock.advance_and_settle(0.9)  # second backoff is 1 s: not yet
    assert running.failures == 2
    owners.down.clear()  # the owner is back
    await clock.advance_and_settle(0.1)
    assert [r.node for b in owners.reports(1) for r in b.reports] == ["node-0", "node-1", "node-2"]
    assert running.failures == 0 and running.queued == 0


async def test_reports_older_than_the_judges_horizon_are_dropped_not_sent(
    owners: Owners, clock: FakeClock
) -> None:
    fwd, metrics = make(owners, clock)
    fwd.report(occurrence(clock, 0, ago=3700.0), home=1)
    fwd.report(occurrence(clock, 1), home=1)
    assert await fwd.flush()
    assert [r.node for b in owners.reports() for r in b.reports] == ["node-1"]
    assert metrics.sent.labels("reports", "dropped")._value.get() == 1


def _attempt(clock: FakeClock, node: str, ago: float, job: str = "ml/JobSet/train") -> JobAttempt:
    at = clock.monotonic() - ago
    return JobAttempt(job, first_at=at, last_at=at + 3, node=node, gpu=f"GPU-{node}", xid=31)


async def test_attempt_sets_go_to_the_nodes_shard_when_they_change(
    owners: Owners, clock: FakeClock
) -> None:
    fwd, _ = make(owners, clock)
    a1, a2 = _attempt(clock, "node-a", 1800), _attempt(clock, "node-a", 900)
    b1 = _attempt(clock, "node-b", 900, job="ml/Job/other")
    fwd.attempts([a1, a2, b1])
    assert await fwd.flush()
    sent = {
        (s, st.job): [a.first_at for a in st.attempts]
        for s, b in owners.attempts()
        for st in b.sets
    }
    assert sent == {
        (0, "ml/JobSet/train"): [
            clock.now() - timedelta(seconds=1800),
            clock.now() - timedelta(seconds=900),
        ],
        (2, "ml/Job/other"): [clock.now() - timedelta(seconds=900)],
    }
    assert all(st.shard == s for s, b in owners.attempts() for st in b.sets)

    owners.posts.clear()
    fwd.attempts([a1, a2, b1])  # unchanged: nothing sent
    assert await fwd.flush() and owners.posts == []

    fwd.attempts([a1, a2])  # the other job's attempts left the window: an empty set
    assert await fwd.flush()
    [(shard, batch)] = owners.attempts()
    assert shard == 2 and [(s.job, s.attempts) for s in batch.sets] == [("ml/Job/other", [])]

    owners.posts.clear()
    clock.advance(60.0)  # handoff_resend_s: sent again (a new owner may have none)
    assert await fwd.flush()
    [(shard, batch)] = owners.attempts()
    assert shard == 0 and len(batch.sets[0].attempts) == 2


async def test_an_attempt_on_a_node_of_unknown_shard_waits(
    owners: Owners, clock: FakeClock
) -> None:
    fwd, _ = make(owners, clock)
    fwd.attempts([_attempt(clock, "node-gone", 10)])
    assert not await fwd.flush()  # tried again after a backoff
    assert owners.posts == []
