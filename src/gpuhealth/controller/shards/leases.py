"""This replica's shards, owned through their Leases.

Every ``retry_period_s`` :class:`ShardLeases` reads each shard's Lease
(``<lease_name>-shard-<i>``, :func:`shard_lease_name`), sees which are held and live as the
one-Lease elector does (a holder is live while the Lease changed within its duration, on this
replica's own monotonic clock), and asks :func:`gpuhealth.controller.shards.ownership.to_campaign`
which shards to ask for. Each shard it asks for has its own
:class:`~gpuhealth.controller.leadership.election.LeaderElector` on that Lease (acquire, renew,
renew deadline, lose, release: exactly the one Lease's rules); a shard it no longer asks for
and does not hold has its campaign stopped. :meth:`ShardLeases.owned` is the set of shards
whose elector leads now: what this replica may serve and write. A lost Lease stops that
shard's ownership at once (the elector's ``is_leader`` goes false before anything else) and
the shard is asked for again under the same rules. On a clean shutdown (:meth:`release`)
every held Lease is given up, so that other replicas take the shards at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.lease import LeaseRecord
from gpuhealth.controller.kube.rest import KubeError
from gpuhealth.controller.leadership.election import LeaderElector, LeaderMetrics, LeaseStore
from gpuhealth.controller.leadership.settings import LeaderSettings
from gpuhealth.controller.shards.ownership import ShardView, to_campaign
from gpuhealth.controller.shards.settings import ShardSettings

log = get_logger("shards")


def shard_lease_name(lease_name: str, shard: int) -> str:
    """The Lease of shard ``shard``: ``<lease_name>-shard-<i>``."""
    return f"{lease_name}-shard-{shard}"


def shard_service_name(service: str, shard: int) -> str:
    """The Service through which agents reach shard ``shard``'s owner:
    ``<leader.service>-shard-<i>`` (its owner publishes the EndpointSlice, as the leader does
    for ``leader.service``)."""
    return f"{service}-shard-{shard}"


@dataclass
class _Seen:
    record: LeaseRecord | None
    changed_at: float
    """Monotonic time the record was last seen to change."""
    free_since: float | None = None
    """Monotonic time it was first seen free, None while it is held and live."""


class ShardLeases:
    def __init__(
        self,
        leases: Sequence[LeaseStore],
        leader: LeaderSettings,
        shards: ShardSettings,
        identity: str,
        *,
        clock: Clock,
        metrics: LeaderMetrics | None = None,
    ) -> None:
        if len(leases) != shards.count:
            raise ValueError(f"{len(leases)} Leases for {shards.count} shards")
        self._leases = list(leases)
        self.leader = leader
        self.shards = shards
        self.identity = identity
        self._clock = clock
        self._metrics = metrics or LeaderMetrics(None)
        self._seen: dict[int, _Seen] = {}
        self._electors: dict[int, LeaderElector] = {}
        self._campaigns: dict[int, asyncio.Task[None]] = {}
        self.changed = asyncio.Event()
        """Set when a shard's Lease is won or lost (its elector starts or stops its work):
        :class:`~gpuhealth.controller.shards.owner.ShardOwner` clears it and reads
        :meth:`owned` again."""

    def owned(self) -> frozenset[int]:
        """The shards this replica leads now."""
        return frozenset(i for i, e in self._electors.items() if e.is_leader)

    async def run(self) -> None:
        """The named task ``shard-leases``: look, decide, start or stop campaigns, forever."""
        try:
            while True:
                views = await self.look()
                self._steer(
                    to_campaign(
                        views,
                        self.identity,
                        replicas=self.shards.replicas,
                        takeover_after_s=self.shards.takeover_after_s,
                    )
                )
                await self._clock.sleep(self.leader.retry_period_s)
        finally:
            for task in self._campaigns.values():
                task.cancel()
            for task in self._campaigns.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def look(self) -> list[ShardView]:
        """Every shard's Lease read once; one that cannot be read keeps what was last seen."""
        now = self._clock.monotonic()
        views = []
        for i, lease in enumerate(self._leases):
            try:
                record = await lease.get(timeout_s=self.leader.request_timeout_s)
            except (KubeError, TimeoutError, OSError) as exc:
                self._metrics.lease_errors.inc()
                log.info("shard_lease_unreadable", shard=i, error=str(exc))
                record = self._seen[i].record if i in self._seen else None
            views.append(self._view(i, record, now))
        return views

    def _view(self, i: int, record: LeaseRecord | None, now: float) -> ShardView:
        seen = self._seen.get(i)
        if seen is None or seen.record != record:
            seen = _Seen(record, now, seen.free_since if seen else None)
            self._seen[i] = seen
        holder = record.holder if record else ""
        duration = (record.duration_s if record else 0) or self.leader.lease_duration_s
        live = bool(holder) and now < seen.changed_at + duration
        if holder and live:
            seen.free_since = None
        elif seen.free_since is None:
            seen.free_since = now
        free_for = 0.0 if seen.free_since is None else now - seen.free_since
        return ShardView(shard=i, holder=holder, live=live, free_for_s=free_for)

    def _steer(self, want: frozenset[int]) -> None:
        for i in sorted(want - self._campaigns.keys()):
            seen = self._seen.get(i)
            elector = LeaderElector(
                self._leases[i],
                self.leader,
                self.identity,
                self._held,
                clock=self._clock,
                metrics=self._metrics,
                # what this replica watched of the Lease counts: a Lease it saw unrenewed for
                # its duration is taken at once, not watched that long again
                observed=(seen.record, seen.changed_at) if seen and seen.record else None,
            )
            self._electors[i] = elector
            self._campaigns[i] = asyncio.create_task(elector.run(), name=f"shard-lease-{i}")
            log.info("shard_campaign_started", shard=i, identity=self.identity)
        for i in sorted(self._campaigns.keys() - want):
            if self._electors[i].is_leader:
                continue  # held: kept until this replica stops
            self._campaigns.pop(i).cancel()
            del self._electors[i]
            log.info("shard_campaign_stopped", shard=i, identity=self.identity)

    async def _held(self) -> None:
        """A shard's elector's work while its Lease is held: tell :attr:`changed` (what the
        owner serves reads :meth:`owned`), then wait until the elector cancels it on a lost
        Lease, and tell again."""
        self.changed.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.changed.set()

    async def release(self) -> None:
        """Clean shutdown: every campaign stopped, every held Lease given up."""
        tasks = list(self._campaigns.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for i, elector in sorted(self._electors.items()):
            await elector.release()
            log.info("shard_released", shard=i, identity=self.identity)
        self._campaigns.clear()
        self._electors.clear()
