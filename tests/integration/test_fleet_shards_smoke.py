"""The ``fleet_shards`` benchmark's harness run tiny (:mod:`bench.bench_fleet_shards`): 60
nodes in 3 shards (and in 1: today's controller) over 3 real ``gpuhealth-controller``
replicas, agents from 2 separate processes, Leases shortened. What the benchmark measures
must hold at any size:

- every agent connects to the replica that owns its shard, and no other;
- a fault on a node of each shard is tainted by that shard's owner, no other replica writes;
- the owner of shard 0 SIGKILLed: its shard's agents come back (to the replica that takes
  it), no other shard's agent loses its stream;
- a replica added moves nothing; a replica removed cleanly has its shard taken over, only its
  agents move;
- no node ever loses a hard taint of ours (the test's own Node watch), and every faulted node
  is still tainted at the end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.bench_fleet_shards import Plan, measure

pytestmark = pytest.mark.integration

FAST = {
    "leader": {
        "lease_duration_s": 4,
        "renew_deadline_s": 3.0,
        "retry_period_s": 1.0,
        "endpoint_interval_s": 1.0,
    },
    "shards": {"takeover_after_s": 3.0},
    "watch": {"relist_backoff_s": 0.2, "relist_backoff_max_s": 1.0},
}
PLAN = Plan(
    nodes=60,
    shards=3,
    replicas=3,
    workers=2,
    faults_per_shard=1,
    steady_s=4.0,
    add_watch_s=8.0,
    settings=FAST,
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shards", [1, 3])
async def test_shards_hold_their_agents_through_a_kill_and_a_replica_added_and_removed(
    kube_assets: Path, shards: int
) -> None:
    """With one shard: today's controller (a leader and two standbys, the leader's Service),
    the harness's own check; with three: the shards."""
    out: dict[str, float] = {}
    plan = dataclasses.replace(PLAN, shards=shards)
    await measure(plan, out, lambda what: print(f"[fleet_shards smoke, S={shards}] {what}"))
    assert out["misplaced_agents"] == 0, out
    assert out["fault_taints_elsewhere"] == 0, out
    assert out["kill_other_shards_reconnected"] == 0, out
    assert out["kill_shards_untaken"] == 0, out
    assert out["add_shards_moved"] == 0 and out["add_agents_reconnected"] == 0, out
    assert out["remove_exit_code"] == 0, out
    assert out["remove_shards_untaken"] == 0, out
    assert out["remove_other_shards_reconnected"] == 0, out
    assert out["hard_taints_lost"] == 0 and out["faulted_untainted"] == 0, out
    # each moved shard's agents are back within a Lease's expiry, the takeover and back-off
    assert out["kill_agents_back_s"] < 60 and out["remove_agents_back_s"] < 60, out
