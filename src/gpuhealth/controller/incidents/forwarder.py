"""Past one process, the sending side of the job handoffs (:mod:`.handoff`): the named task
``shard-handoff``.

- **Reports** a judge hands over (charged to a job homed in a shard another replica owns,
  :mod:`.job_home`) wait in a queue per home shard, at most ``shards.handoff_queue_max`` in
  all (beyond it a report is dropped and counted: ``gpuhealth_shard_handoffs_total{kind=
  "reports", result="dropped"}``), and are POSTed to the home shard's owner in batches of at
  most ``shards.handoff_batch_max`` reports and ``http.max_body_bytes`` bytes. Their time is
  wall-clock time from the moment they are queued.
- **Attempts**: the home owner's latest attempts whose first fault is on a node another
  replica owns. Each attempt goes to the owner of its node's shard (the Node's shard label,
  read as the stream's door reads it); per job and shard, the set is sent when it changed
  (an empty one when none is left) and again every ``shards.handoff_resend_s`` (an owner that
  took the shard over since has none).

A POST that fails (no owner published, refused, not answered) leaves what it carried queued;
the task tries again after ``shards.handoff_backoff_s``, doubling up to
``shards.handoff_backoff_max_s``. Reports older than the judge's horizon are dropped instead
of sent: they could count for nothing.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from gpuhealth.common.clock import Clock, sleep_or_wake
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.blame import JobAttempt, XidOccurrence
from gpuhealth.controller.incidents.handoff import (
    ATTEMPTS_PATH,
    REPORTS_PATH,
    AttemptBatch,
    AttemptSet,
    HandedXid,
    HandoffMetrics,
    XidBatch,
    handed_attempt,
    handed_xid,
)
from gpuhealth.controller.shards.peers import ShardAnswer

log = get_logger("incidents.handoff")

BODY_OVERHEAD = 64
"""Bytes of a batch's body besides its items (``{"reports":[...]}``), with room to spare."""


class Poster(Protocol):
    """:meth:`gpuhealth.controller.shards.peers.ShardPeers.post`."""

    async def post(self, shard: int, path: str, body: bytes) -> ShardAnswer: ...


@dataclass(frozen=True, slots=True)
class HandoffLimits:
    """The ``shards.handoff_*`` settings and the body bound (``http.max_body_bytes``)."""

    queue_max: int
    batch_max: int
    max_body_bytes: int
    backoff_s: float
    backoff_max_s: float
    resend_s: float
    horizon_s: float
    """How far back the judge looks: an older report counts for nothing."""


def backoff(failures: int, base_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` failed rounds in a row (pure)."""
    return float(min(max_s, base_s * 2 ** max(0, failures - 1)))


class HandoffForwarder:
    def __init__(
        self,
        peers: Poster,
        limits: HandoffLimits,
        *,
        clock: Clock,
        metrics: HandoffMetrics,
        node_shard: Callable[[str], Awaitable[int | None]],
    ) -> None:
        """``node_shard``: the shard a Node's label names (None: not known now)."""
        self._peers = peers
        self.limits = limits
        self._clock = clock
        self.metrics = metrics
        self._node_shard = node_shard
        self._reports: dict[int, deque[tuple[float, HandedXid]]] = {}
        """Home shard -> (monotonic time, report), oldest first."""
        self.queued = 0
        self._attempts: dict[str, tuple[JobAttempt, ...]] = {}
        """The latest foreign attempts, by job."""
        self._sent: dict[tuple[str, int], tuple[tuple[JobAttempt, ...], float]] = {}
        """(job, shard) -> the set last delivered and when."""
        self.failures = 0
        """Failed rounds in a row."""
        self._wake = asyncio.Event()

    # -- from the judge ------------------------------------------------------------------------

    def report(self, r: XidOccurrence, home: int) -> None:
        """Queue ``r`` (charged to a job homed in ``home``) for the home's owner."""
        if r.job is None:
            return
        if self.queued >= self.limits.queue_max:
            self.metrics.sent.labels("reports", "dropped").inc()
            return
        item = (r.at, handed_xid(r, r.job, self._clock))
        self._reports.setdefault(home, deque()).append(item)
        self.queued += 1
        self._wake.set()

    def attempts(self, foreign: Sequence[JobAttempt]) -> None:
        """The home owner's attempts now whose first fault is on a node it does not own."""
        by_job: dict[str, tuple[JobAttempt, ...]] = {}
        for a in foreign:
            by_job[a.job] = (*by_job.get(a.job, ()), a)
        if by_job != self._attempts:
            self._attempts = by_job
            self._wake.set()

    # -- the named task ``shard-handoff`` ------------------------------------------------------

    async def run(self) -> None:
        while True:
            await sleep_or_wake(self._clock, self.limits.resend_s, self._wake)
            self._wake.clear()
            while not await self.flush():
                self.failures += 1
                await self._clock.sleep(
                    backoff(self.failures, self.limits.backoff_s, self.limits.backoff_max_s)
                )
            self.failures = 0

    async def flush(self) -> bool:
        """Send what is queued and what changed; False when some of it could not be."""
        ok = True
        for shard in list(self._reports):
            ok = await self._flush_reports(shard) and ok
        return await self._flush_attempts() and ok

    async def _flush_reports(self, shard: int) -> bool:
        queue = self._reports[shard]
        horizon = self._clock.monotonic() - self.limits.horizon_s
        while queue and queue[0][0] < horizon:
            queue.popleft()
            self.queued -= 1
            self.metrics.sent.labels("reports", "dropped").inc()
        while queue:
            items = self._batch(queue)
            body = msgspec.json.encode(XidBatch(items))
            answer = await self._peers.post(shard, REPORTS_PATH, body)
            if not answer.available:
                self.metrics.sent.labels("reports", "failed").inc(len(items))
                log.info("shard_handoff_failed", kind="reports", shard=shard, why=answer.reason)
                return False
            for _ in items:
                queue.popleft()
            self.queued -= len(items)
            self.metrics.sent.labels("reports", "sent").inc(len(items))
        del self._reports[shard]
        return True

    def _batch(self, queue: deque[tuple[float, HandedXid]]) -> list[HandedXid]:
        """The oldest reports that fit one body (at least one)."""
        room = self.limits.max_body_bytes - BODY_OVERHEAD
        out: list[HandedXid] = []
        for _, item in itertools.islice(queue, self.limits.batch_max):
            room -= len(msgspec.json.encode(item)) + 1
            if out and room < 0:
                break
            out.append(item)
        return out

    async def _flush_attempts(self) -> bool:
        now = self._clock.monotonic()
        want: dict[tuple[str, int], tuple[JobAttempt, ...]] = {}
        unresolved: set[str] = set()
        for job, attempts in self._attempts.items():
            for a in attempts:
                shard = await self._node_shard(a.node)
                if shard is None:
                    unresolved.add(job)
                    continue
                want[(job, shard)] = (*want.get((job, shard), ()), a)
        due = {
            key: sets
            for key, sets in want.items()
            if key[0] not in unresolved
            and (
                (sent := self._sent.get(key)) is None
                or sent[0] != sets
                or now - sent[1] >= self.limits.resend_s
            )
        }
        due |= {k: () for k in self._sent if k not in want and k[0] not in unresolved}
        by_shard: dict[int, list[tuple[str, tuple[JobAttempt, ...]]]] = {}
        for (job, shard), sets in due.items():
            by_shard.setdefault(shard, []).append((job, sets))
        ok = not unresolved
        for shard, group in sorted(by_shard.items()):
            ok = await self._send_sets(shard, group, now) and ok
        return ok

    async def _send_sets(
        self, shard: int, group: list[tuple[str, tuple[JobAttempt, ...]]], now: float
    ) -> bool:
        for start in range(0, len(group), self.limits.batch_max):
            chunk = group[start : start + self.limits.batch_max]
            body = msgspec.json.encode(
                AttemptBatch(
                    [
                        AttemptSet(job, shard, [handed_attempt(a, self._clock) for a in sets])
                        for job, sets in chunk
                    ]
                )
            )
            answer = await self._peers.post(shard, ATTEMPTS_PATH, body)
            if not answer.available:
                self.metrics.sent.labels("attempts", "failed").inc(len(chunk))
                log.info("shard_handoff_failed", kind="attempts", shard=shard, why=answer.reason)
                return False
            for job, sets in chunk:
                if sets:
                    self._sent[(job, shard)] = (sets, now)
                else:
                    self._sent.pop((job, shard), None)
            self.metrics.sent.labels("attempts", "sent").inc(len(chunk))
        return True
