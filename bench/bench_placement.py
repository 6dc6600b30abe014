"""Scheduler extender latency (5,000 nodes, full HTTP round-trip) and idle evaluation cost.

- ``extender_filter_p99_ms`` / ``extender_prioritize_p99_ms``: an aiohttp client POSTs
  ExtenderArgs with 5,000 ``NodeNames`` (nodeCacheCapable) to the real handlers served on
  127.0.0.1, fleet state fed through protocol messages into the real Fleet; p99 over the
  requests (medians reported alongside for context).
- ``idle_eval_ms``: one :meth:`IdleTracker.evaluate` over 80,000 tracked allocations (a
  third of them under the threshold, some idle long enough to be flagged); median of runs.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime

import aiohttp
import msgspec
from aiohttp import web

from bench.registry import Benchmark, Target
from gpuhealth.common.clock import FakeClock
from gpuhealth.controller.config import FleetSettings
from gpuhealth.controller.fleet import Fleet
from gpuhealth.controller.idle import IdleConfig
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.controller.placement import ExtenderHandlers, PlacementIndex, extender_app
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Hello,
    Snapshot,
)

NODES = 5000
GPUS_PER_NODE = 8
REQUESTS = 300
WARMUP = 20
ALLOCATIONS = 80_000
IDLE_RUNS = 15
T0 = datetime(2026, 11, 22, 10, tzinfo=UTC)


def _fleet(rng: random.Random) -> Fleet:
    fleet = Fleet(FleetSettings(), FakeClock())
    for n in range(NODES):
        node = f"gpu-node-{n:05d}"
        fleet.on_connect(
            node, Hello(seq=1, node=node, stream_id="s", boot_id="b", agent_version="b")
        )
        gpus = []
        for i in range(GPUS_PER_NODE):
            uuid = f"GPU-{n:05d}-{i}"
            bad = rng.random() < 0.01
            gpus.append(
                GpuStatus(
                    info=GpuInfo(index=i, uuid=uuid),
                    state="unhealthy" if bad else "degraded" if rng.random() < 0.02 else "healthy",
                    conditions=(
                        [Condition(reason="XidError", code="xid-79", severity="unhealthy")]
                        if bad
                        else []
                    ),
                    telemetry=GpuTelemetry(
                        uuid=uuid,
                        temperature_c=rng.uniform(35, 88),
                        slowdown_temperature_c=90.0,
                        sbe_recent=rng.choice([0, 0, 0, 1, 5, 40]),
                        memory_bandwidth_ratio=rng.random(),
                    ),
                )
            )
        held = rng.randint(0, GPUS_PER_NODE)
        allocs = [
            Allocation(
                namespace="ns", pod=f"p-{n}-{i}", container="c", gpu_uuid=g.info.uuid, device_id="d"
            )
            for i, g in enumerate(gpus[:held])
        ]
        fleet.on_message(
            node, Snapshot(seq=2, node=node, taken_at=T0, gpus=gpus, allocations=allocs)
        )
    return fleet


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _extender() -> dict[str, float]:
    rng = random.Random(7)
    index = PlacementIndex(_fleet(rng))
    app = extender_app(ExtenderHandlers(lambda: index.summaries))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    names = [f"gpu-node-{n:05d}" for n in range(NODES)]
    pod = {
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
        },
    }
    body = msgspec.json.encode({"Pod": pod, "NodeNames": names})
    out: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for verb in ("filter", "prioritize"):
                url = f"http://127.0.0.1:{port}/scheduler/{verb}"
                times: list[float] = []
                for i in range(WARMUP + REQUESTS):
                    t0 = time.perf_counter()
                    async with session.post(
                        url, data=body, headers={"Content-Type": "application/json"}
                    ) as resp:
                        data = await resp.read()
                        assert resp.status == 200, data[:200]
                    if i >= WARMUP:
                        times.append((time.perf_counter() - t0) * 1000)
                out[f"extender_{verb}_p99_ms"] = _p(times, 0.99)
                out[f"extender_{verb}_median_ms"] = statistics.median(times)
    finally:
        await runner.cleanup()
    return out


async def _idle() -> dict[str, float]:
    rng = random.Random(11)
    clock = FakeClock()
    tracker = IdleTracker(
        IdleConfig(window_s=1800, max_gap_s=900, max_allocations=ALLOCATIONS), clock
    )
    per_node = 8
    batches = []
    for n in range(ALLOCATIONS // per_node):
        usage = [
            AllocationUsage(
                namespace=f"ns-{n % 50}",
                pod=f"p-{n}-{i}",
                container="c",
                gpu_uuid=f"GPU-{n}-{i}",
                utilization_ratio=rng.random() * (0.04 if rng.random() < 0.33 else 1.0),
            )
            for i in range(per_node)
        ]
        batches.append((f"node-{n}", usage, {f"GPU-{n}-{i}": str(i) for i in range(per_node)}))
    for step in range(4):  # 40 min of heartbeats, one per 10 min per node
        for node, usage, index in batches:
            tracker.observe(node, usage, index)
        clock.advance(600 if step < 3 else 60)
    assert len(tracker) == ALLOCATIONS
    times = []
    for _ in range(IDLE_RUNS):
        t0 = time.perf_counter()
        tracker.evaluate()
        times.append((time.perf_counter() - t0) * 1000)
        tracker.pending.clear()
    assert tracker.idle, "the benchmark should flag some allocations"
    return {"idle_eval_ms": statistics.median(times)}


BENCHMARKS = [
    Benchmark(
        name="extender_5000_nodes",
        targets=(
            Target("extender_filter_p99_ms", "ms", 5.0, "<="),
            Target("extender_prioritize_p99_ms", "ms", 5.0, "<="),
        ),
        run=_extender,
    ),
    Benchmark(
        name="idle_eval_80000_allocations",
        targets=(Target("idle_eval_ms", "ms", 100.0, "<="),),
        run=_idle,
    ),
]
