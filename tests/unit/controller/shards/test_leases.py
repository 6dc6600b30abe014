"""What a replica sees of the shards' Leases, on a fake clock: a holder is live while its
Lease changes within its duration, a free shard's time counts from when it was first seen
free, and a Lease that cannot be read keeps what was last seen."""

from __future__ import annotations

import pytest

from gpuhealth.controller.kube.lease import LeaseRecord
from gpuhealth.controller.kube.rest import TransientKubeError
from gpuhealth.controller.leadership.settings import LeaderSettings
from gpuhealth.controller.shards.leases import ShardLeases, shard_lease_name, shard_service_name
from gpuhealth.controller.shards.ownership import ShardView
from gpuhealth.controller.shards.settings import ShardSettings
from tests.support.clock import FakeClock

LEADER = LeaderSettings(lease_duration_s=15, renew_deadline_s=10.0, retry_period_s=2.0)


class ReadOnlyLease:
    """A shard's Lease as others write it; reading it can fail."""

    def __init__(self, record: LeaseRecord | None = None) -> None:
        self.record = record
        self.down = False

    async def get(self, *, timeout_s: float) -> LeaseRecord | None:
        if self.down:
            raise TransientKubeError("connection refused", 0)
        return self.record

    async def create(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        raise AssertionError("only looked at")

    async def update(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        raise AssertionError("only looked at")


def held(holder: str, version: int) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration_s=15, resource_version=str(version))


def test_the_lease_names() -> None:
    assert shard_lease_name("gpuhealth-controller", 3) == "gpuhealth-controller-shard-3"
    assert shard_service_name("gh-controller", 0) == "gh-controller-shard-0"


def test_a_lease_count_other_than_the_shards_is_refused() -> None:
    with pytest.raises(ValueError, match="2 Leases for 3 shards"):
        ShardLeases(
            [ReadOnlyLease(), ReadOnlyLease()],
            LEADER,
            ShardSettings(count=3),
            "me",
            clock=FakeClock(),
        )


async def test_liveness_and_free_time_as_observed() -> None:
    clock = FakeClock()
    renewed, silent, never = ReadOnlyLease(held("a", 1)), ReadOnlyLease(held("b", 1)), None
    never_lease = ReadOnlyLease(never)
    shards = ShardLeases(
        [renewed, silent, never_lease], LEADER, ShardSettings(count=3), "me", clock=clock
    )
    assert await shards.look() == [
        ShardView(0, "a", live=True),
        ShardView(1, "b", live=True),
        ShardView(2, "", live=False, free_for_s=0.0),
    ]
    clock.advance(10)
    renewed.record = held("a", 2)  # a renews; b does not
    await shards.look()
    clock.advance(6)  # 16 s since b's Lease last changed: past its 15 s
    views = await shards.look()
    assert views[0] == ShardView(0, "a", live=True)
    assert views[1] == ShardView(1, "b", live=False, free_for_s=0.0)  # seen free from now
    assert views[2].free_for_s == 16.0  # free since first seen
    clock.advance(5)
    views = await shards.look()
    assert views[1].free_for_s == 5.0
    # b comes back (its Lease changes): live again, no longer free
    silent.record = held("b", 2)
    assert (await shards.look())[1] == ShardView(1, "b", live=True)


async def test_an_unreadable_lease_keeps_what_was_last_seen() -> None:
    clock = FakeClock()
    lease = ReadOnlyLease(held("a", 1))
    shards = ShardLeases([lease], LEADER, ShardSettings(count=1), "me", clock=clock)
    assert await shards.look() == [ShardView(0, "a", live=True)]
    lease.down = True
    clock.advance(5)
    assert await shards.look() == [ShardView(0, "a", live=True)]
    clock.advance(11)  # nothing seen to change for 16 s: a's hold has lapsed as far as we know
    assert await shards.look() == [ShardView(0, "a", live=False, free_for_s=0.0)]
