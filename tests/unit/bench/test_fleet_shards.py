"""The fleet_shards bench's pure parts: the projection to 100,000 nodes, and what the agents'
processes report per shard."""

from __future__ import annotations

import pytest

from bench.bench_fleet_shards import projection
from bench.fleet_scale_agents import XID79, NodeGpus, _Agent, _by_shard


@pytest.mark.parametrize(
    ("owned", "spare", "replicas", "per_replica", "memory_gib"),
    [
        # 0.025 MiB a node above a 100 MiB spare: 20,000 a replica (the envelope), 5 + 1
        ([(10_000, 350.0, 5.0), (10_000, 340.0, 4.0)], (100.0, 1.0), 6, 20_000, 3.027),
        # 0.05 MiB a node: 768 MiB holds 13,360 nodes; 8 replicas hold 12,500 each, 9 in all
        ([(10_000, 600.0, 5.0)], (100.0, 1.0), 9, 12_500, 5.762),
        # CPU binds first: 0.002 % a node above 2 %: 9,000 a replica, 12 hold them, 13 in all
        ([(5_000, 200.0, 12.0)], (100.0, 2.0), 13, 100_000 / 12, 3.223),
        # a small run's noise (owners below the spare) costs nothing per node
        ([(60, 99.0, 0.1)], (100.0, 0.5), 6, 20_000, 0.586),
    ],
)
def test_the_projection_keeps_every_replica_inside_the_envelope(
    owned: list[tuple[int, float, float]],
    spare: tuple[float, float],
    replicas: int,
    per_replica: float,
    memory_gib: float,
) -> None:
    p = projection(owned, *spare)
    assert p["projected_100k_replicas"] == replicas
    assert p["projected_100k_nodes_per_replica"] == pytest.approx(per_replica)
    assert p["projected_100k_memory_gib"] == pytest.approx(memory_gib, abs=0.001)
    assert p["projected_100k_replica_rss_mib"] <= 768.0
    assert p["projected_100k_replica_cpu_pct"] <= 20.0


def test_agents_report_per_shard_and_a_fault_stays_in_later_snapshots() -> None:
    agents = [_Agent(i, f"n{i}", "t", shard=i % 2) for i in range(5)]
    agents[0].live, agents[2].live, agents[2].losses, agents[2].back_at = True, True, 2, 7.5
    agents[1].back_at = 3.25
    assert _by_shard(agents) == "0:3:2:2:7.500000 1:2:0:0:3.250000"
    gpus = NodeGpus(0, "n0")
    healthy = gpus.snapshot("real", 1, "n0")
    faulty = gpus.snapshot("real", 2, "n0", faulty=True)
    assert [g.state for g in healthy.gpus] == ["healthy"] * 8
    assert [g.state for g in faulty.gpus] == ["unhealthy"] + ["healthy"] * 7
    assert faulty.gpus[0].conditions == [XID79]
