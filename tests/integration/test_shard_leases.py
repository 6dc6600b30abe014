"""Shards owned through their Leases, against the real API server: replicas split the
shards, a replica stopping hands its shards over at once, a replica killed (its Leases left
to expire) has them taken over after the lease duration, and no shard ever has two owners."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.kube.lease import LeaseClient
from gpuhealth.controller.leadership.settings import LeaderSettings
from gpuhealth.controller.shards.leases import ShardLeases, shard_lease_name
from gpuhealth.controller.shards.settings import ShardSettings
from tests.support.wait import until

pytestmark = pytest.mark.integration

LEADER = LeaderSettings(
    namespace="default", lease_duration_s=3, renew_deadline_s=2.0, retry_period_s=1.0
)
SHARDS = ShardSettings(count=3, replicas=2, takeover_after_s=2.0)
ALL = frozenset(range(SHARDS.count))


class Replicas:
    """Replicas' ShardLeases on one set of shard Leases, each running as a task, and a
    watcher that records any moment two of them own the same shard."""

    def __init__(self, api: Any, base: str) -> None:
        self.api = api
        self.base = base
        self.running: dict[str, tuple[ShardLeases, asyncio.Task[None]]] = {}
        self.overlaps: list[tuple[int, list[str]]] = []

    def start(self, identity: str) -> ShardLeases:
        leases = [
            LeaseClient(self.api, LEADER.namespace, shard_lease_name(self.base, i))
            for i in range(SHARDS.count)
        ]
        replica = ShardLeases(leases, LEADER, SHARDS, identity, clock=SystemClock())
        self.running[identity] = (replica, asyncio.create_task(replica.run()))
        return replica

    async def stop(self, identity: str, *, release: bool) -> None:
        """Stopped cleanly (its Leases released), or killed (left to expire)."""
        replica, task = self.running.pop(identity)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if release:
            await replica.release()

    async def watch(self) -> None:
        while True:
            for shard in ALL:
                owners = [i for i, (r, _) in self.running.items() if shard in r.owned()]
                if len(owners) > 1:
                    self.overlaps.append((shard, owners))
            await asyncio.sleep(0.02)

    def owned(self, identity: str) -> frozenset[int]:
        return self.running[identity][0].owned()

    async def holders(self) -> dict[int, str]:
        out = {}
        for i in ALL:
            record = await LeaseClient(
                self.api, LEADER.namespace, shard_lease_name(self.base, i)
            ).get(timeout_s=5)
            out[i] = record.holder if record else ""
        return out


@pytest.fixture
async def replicas(api_client: Any, unique_name: Callable[[str], str]) -> AsyncIterator[Replicas]:
    r = Replicas(api_client, unique_name("gpuhealth-shards"))
    watcher = asyncio.create_task(r.watch())
    try:
        yield r
    finally:
        for identity in list(r.running):
            await r.stop(identity, release=True)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_replicas_split_the_shards_and_hand_them_over(replicas: Replicas) -> None:
    replicas.start("replica-a")
    await until(lambda: len(replicas.owned("replica-a")) == 2, "a's fair share", timeout_s=10)
    replicas.start("replica-b")

    def split() -> bool:
        a, b = replicas.owned("replica-a"), replicas.owned("replica-b")
        return a | b == ALL and not a & b

    await until(split, "the shards split between a and b", timeout_s=10)
    assert replicas.owned("replica-a") == {0, 1} and replicas.owned("replica-b") == {2}
    assert await replicas.holders() == {0: "replica-a", 1: "replica-a", 2: "replica-b"}

    # a stops cleanly: its Leases released, b takes one at once (its share) and the other
    # once it has been free for takeover_after_s; never both owners of one shard
    t0 = time.monotonic()
    await replicas.stop("replica-a", release=True)
    await until(lambda: replicas.owned("replica-b") == ALL, "b owns every shard", timeout_s=15)
    handover_s = time.monotonic() - t0
    assert handover_s < SHARDS.takeover_after_s + 3 * LEADER.retry_period_s + 1.0, handover_s
    assert set((await replicas.holders()).values()) == {"replica-b"}

    # a spare holds nothing while every shard is held and live
    replicas.start("replica-c")
    await asyncio.sleep(3 * LEADER.retry_period_s)
    assert replicas.owned("replica-c") == frozenset()

    # b is killed: its Leases stay with it until they expire; then c takes every shard
    t0 = time.monotonic()
    await replicas.stop("replica-b", release=False)
    assert set((await replicas.holders()).values()) == {"replica-b"}
    await until(lambda: replicas.owned("replica-c") == ALL, "c owns every shard", timeout_s=20)
    takeover_s = time.monotonic() - t0
    assert takeover_s >= LEADER.lease_duration_s - LEADER.retry_period_s, takeover_s
    assert set((await replicas.holders()).values()) == {"replica-c"}
    assert replicas.overlaps == []
