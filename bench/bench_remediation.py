"""Remediation: one reset episode end to end, and the loop's throughput on 1,000 nodes.

- ``remediation_episode``: the real ``gpuhealth-controller`` and one real ``gpuhealth-agent``
  per node (simulated GPUs) against the real API server, as in
  ``tests/integration/test_remediation_e2e.py``. A GPU takes a double-bit ECC error
  (XID 48); the loop quarantines, drains (no pods), orders the reset over the stream,
  validates with a 2 s soak (``validation.soak_s``; production 300 s) and lifts the
  quarantine. Each episode's stage times come from its ``status.times``: detected (the
  agent's fault time) → quarantined → drained → remediated → validated → returned
  (quarantine seen gone). One control plane and controller, ``EPISODES`` nodes one after
  the other.
- ``remediation_throughput``: the real :class:`RemediationRunner` and state machine over
  in-memory ports (``tests/fakes/remediation_world``: the store, nodes, evictions, the
  agent's reports and the taint writer answer at once) for 1,000 faulty nodes with the
  concurrency cap at 1,000 and no soak: episodes driven to Returned per second (wall
  clock; the CPU time is reported beside it). It measures the loop's own cost (decisions,
  status updates, bookkeeping), not the API server's, which bounds a real fleet (every
  episode is about ten writes).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.registry import Benchmark, Target
from localkube import ControlPlane
from localkube.objects import create_gpu_node

EPISODES = 5
STAGES = ("detected", "quarantined", "drained", "remediated", "validated", "returned")
PHASE_METRICS = {
    "quarantined": "remediation_quarantine_s",
    "drained": "remediation_drain_s",
    "remediated": "remediation_reset_s",
    "validated": "remediation_validate_s",
    "returned": "remediation_return_s",
}
EPISODE_TIMEOUT_S = 90.0
POLL_S = 0.1
"""How often the episode is read (its stage times come from its status, not the poll)."""
THROUGHPUT_NODES = 1000


async def _returned(loop: Any, node: str) -> dict[str, str]:
    """The node's episode's ``status.times`` once the quarantine was seen lifted."""
    deadline = time.monotonic() + EPISODE_TIMEOUT_S
    while time.monotonic() < deadline:
        eps = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        times: dict[str, str] = eps[0].get("status", {}).get("times", {}) if eps else {}
        if times.get("returned"):
            return times
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{node}: no Returned episode after {EPISODE_TIMEOUT_S:g}s")


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def _episodes() -> dict[str, list[float]]:
    from gpuhealth.controller.kube.client import make_api_client

    # The integration tests' harness (tests/integration/remediation_procs.py), loaded as a
    # module so that the bench's type check stops at its boundary.
    procs: Any = importlib.import_module("tests.integration.remediation_procs")

    out: dict[str, list[float]] = {"remediation_detect_to_returned_s": []}
    for m in PHASE_METRICS.values():
        out[m] = []
    with tempfile.TemporaryDirectory() as tmp, ControlPlane() as cp:
        api = await make_api_client(str(cp.kubeconfig))
        loop = procs.Loop(cp.kubeconfig, api, Path(tmp), "bench-remediation")
        try:
            nodes = [f"bench-rem-{i}" for i in range(EPISODES)]
            for n in nodes:
                await create_gpu_node(api, n, gpus=2)
            await loop.prepare(nodes)
            loop.start_controller()
            for node in nodes:
                loop.start_agent(node, procs.scenario(*procs.XID48))
                times = await _returned(loop, node)
                at = {s: _at(times[s]) for s in STAGES}
                out["remediation_detect_to_returned_s"].append(
                    (at["returned"] - at["detected"]).total_seconds()
                )
                for prev, stage in itertools.pairwise(STAGES):
                    out[PHASE_METRICS[stage]].append((at[stage] - at[prev]).total_seconds())
                loop.agents[node].stop(5.0)
        finally:
            loop.stop()
            await api.close()
    return out


async def _throughput() -> dict[str, float]:
    from gpuhealth.controller.remediation.model import Phase
    from gpuhealth.controller.remediation.settings import SafetySettings
    from tests.fakes.remediation_world import World, fault_condition, node_facts
    from tests.support.remediation import one_round, runner_for, settings

    w = World()
    for i in range(THROUGHPUT_NODES):
        name = f"node-{i:04d}"
        w.nodes[name] = node_facts(
            name, unhealthy={0: fault_condition("xid-48", "RESET_GPU")}, allocations=None
        )
    cfg = settings(safety=SafetySettings(max_concurrent=THROUGHPUT_NODES, max_fraction=1.0))
    r = runner_for(w, cfg)
    started = time.process_time()
    wall = time.perf_counter()
    for _ in range(40):
        await one_round(w, r)
        done = sum(
            1
            for e in w.store.episodes()
            if e.phase is Phase.RETURNED and e.status.times.returned is not None
        )
        if done == THROUGHPUT_NODES:
            break
        w.advance(5.0)
    cpu = time.process_time() - started
    wall = time.perf_counter() - wall
    if done != THROUGHPUT_NODES:
        raise RuntimeError(f"only {done} of {THROUGHPUT_NODES} episodes returned")
    return {
        "remediation_throughput_episodes_per_s": THROUGHPUT_NODES / wall,
        "remediation_1000_nodes_wall_s": wall,
        "remediation_1000_nodes_cpu_s": cpu,
    }


BENCHMARKS = [
    Benchmark(
        name="remediation_episode",
        targets=(
            Target("remediation_detect_to_returned_s", "s", 10.0, "<="),
            Target("remediation_quarantine_s", "s", 2.0, "<="),
            Target("remediation_drain_s", "s", 2.0, "<="),
            Target("remediation_reset_s", "s", 3.0, "<="),
            Target("remediation_validate_s", "s", 5.0, "<="),
            Target("remediation_return_s", "s", 2.0, "<="),
        ),
        run=_episodes,
        needs_kube=True,
        repeats=1,
    ),
    Benchmark(
        name="remediation_throughput",
        targets=(
            Target("remediation_throughput_episodes_per_s", "episodes/s", 50.0, ">="),
            Target("remediation_1000_nodes_wall_s", "s", 20.0, "<="),
            Target("remediation_1000_nodes_cpu_s", "s", 20.0, "<="),
        ),
        run=_throughput,
        repeats=3,
    ),
]
