"""Remediation throughput end to end: the real controller against the real API server.

``remediation_kube``: the production controller (``gpuhealth.controller.compose.build_controller``,
in this process: fleet, node watch cache, taint reconciler, WriteGate with its circuit breaker,
the GPURemediation store, ``RemediationPods`` for pods and evictions, Events, the runner)
against localkube's kube-apiserver and etcd, with ``NODES`` kwok nodes (kwok runs the pods
and finishes their deletion, as kubelets would). Each node's agent is a
:class:`bench.remediation_fleet.SimAgent` in this process, connected to the real stream
server through an in-memory pipe (no socket, no TokenReview).

A round: one pod per faulty node, holding the GPU that will fail (the agent's PodResources
view says so); then ``faults`` nodes take a double-bit ECC error (XID 48, RESET_GPU) at once.
Every episode goes Pending -> Quarantined (the reconciler's taint) -> Draining (the pod
evicted through the Eviction API, kwok deletes it) -> Remediating (reset order, the agent's
report) -> Validating (``validation.soak_s: 0``; the agent reports) -> Returned (quarantine
lifted). Measured per round: episodes per second (faults / (last ``status.times.returned``
- first fault)), p50 and p99 of fault -> returned per episode, and this process's CPU time
(controller plus the in-process agents). After each ``NODES``-fault round the in-memory
figure (``bench_remediation._throughput``: the same runner over in-memory ports) is taken
again, and the ratio of the two rates is reported: the API server's share, whatever the
machine's load. The controller's RSS growth (VmRSS after the last round - before the
controller was built) is reported once.

Caps raised so that every fault is remediated at once (production defaults in brackets):
``remediation.safety.max_concurrent`` = NODES [1], ``max_fraction`` 1.0 [0.05],
``breaker.max_fraction`` 1.0 [0.10], ``validation.soak_s`` 0 [300], ``remediation.workers``
32 [4]. Everything else is the controller's default (reconciler workers 32, drain
``retry_s`` 15, ``quarantine_check_s`` 5). Between rounds the
GPURemediations are deleted (a new round is not a repeat fault).
"""

from __future__ import annotations

import asyncio
import importlib
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

from bench.registry import Benchmark, Target
from bench.remediation_fleet import SimAgent, heartbeats
from bench.stats import percentile

NODES = 1000
ROUNDS = ((100, 3), (NODES, 1))
"""(faulty nodes, repetitions): 3 rounds of 100 faults, one of 1,000 (a 1,000-fault round
takes 2-3 minutes on the 2-core reference machine; the bench's budget is ~4 minutes)."""
WORKERS = 32
"""``remediation.workers`` (default 4): episodes reconciled concurrently, as many as the
reconciler's default workers. With 4, 100 faults ran at ~4 episodes/s (p50 23 s)."""
NAMESPACE = "bench-work"
CREATE_CONCURRENCY = 32
ROUND_TIMEOUT_S = 300.0
POLL_S = 0.25
"""How often the episodes are listed once every agent has validated (times come from status)."""


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def _limited(items: Iterable[str], one: Callable[[str], Awaitable[Any]]) -> None:
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def run(item: str) -> None:
        async with sem:
            await one(item)

    await asyncio.gather(*(run(i) for i in items))


async def _settle(ctl: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ctl.parts.reconciler.idle():
        if time.monotonic() > deadline:
            raise TimeoutError("reconciler did not settle")
        await asyncio.sleep(0.05)


async def _episodes(api: Any) -> list[dict[str, Any]]:
    from gpuhealth.controller.kube.rest import request
    from gpuhealth.controller.remediation.episode_store import PATH

    items: list[dict[str, Any]] = (await request(api, "GET", PATH, timeout_s=60))["items"]
    return items


async def _round(admin: Any, ctl: Any, agents: list[SimAgent], tag: str) -> dict[str, float]:
    from gpuhealth.controller.kube.rest import request
    from localkube.objects import pod_body

    pod = f"train-{tag}"

    async def create_pod(node: str) -> None:
        body = pod_body(pod, node_name=node, gpus=1)
        body["metadata"]["name"] = f"{pod}-{node}"
        await request(admin, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)

    await _limited((a.node for a in agents), create_pod)
    for a in agents:
        a.hold(NAMESPACE, f"{pod}-{a.node}")
    await _settle(ctl)

    cpu0 = time.process_time()
    faulted = {a.node: a.fault() for a in agents}
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        for a in agents:
            await a.validated.wait()
        while True:
            eps = [e for e in await _episodes(admin) if e["spec"]["nodeName"] in faulted]
            returned = [e for e in eps if e.get("status", {}).get("times", {}).get("returned")]
            if len(returned) == len(agents):
                break
            await asyncio.sleep(POLL_S)
    cpu = time.process_time() - cpu0
    lat = [
        (_at(e["status"]["times"]["returned"]) - faulted[e["spec"]["nodeName"]]).total_seconds()
        for e in returned
    ]
    wrong = [e["metadata"]["name"] for e in returned if e["status"].get("evictedCount") != 1]
    if wrong:
        raise RuntimeError(f"episodes that did not evict exactly one pod: {wrong[:5]}")
    span = max(_at(e["status"]["times"]["returned"]) for e in returned) - min(faulted.values())
    return {
        "rate": len(agents) / span.total_seconds(),
        "p50": statistics.median(lat),
        "p99": percentile(lat, 99),
        "cpu": cpu,
    }


async def _clean(admin: Any, ctl: Any) -> None:
    """Every episode deleted, every evicted pod gone (kwok finished the deletions)."""
    from gpuhealth.controller.kube.rest import request
    from gpuhealth.controller.remediation.episode_store import PATH

    await request(admin, "DELETE", PATH, timeout_s=120)
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    async with asyncio.timeout(120):
        while (await _episodes(admin)) or (await request(admin, "GET", pods))["items"]:
            await asyncio.sleep(0.5)
    await _settle(ctl)


def _config(kubeconfig: str) -> Any:
    from gpuhealth.controller.settings import load_config

    return load_config(
        None,
        {
            "kubeconfig": kubeconfig,
            "leader": {"enabled": False},
            "extender": {"enabled": False},
            "breaker": {"max_fraction": 1.0},
            "remediation": {
                "enabled": True,
                "workers": WORKERS,
                "reset_gpu": {"enabled": True},
                "validation": {"soak_s": 0},
                "safety": {"max_concurrent": NODES, "max_fraction": 1.0},
            },
        },
    )


async def _run() -> dict[str, list[float]]:
    from bench.bench_remediation import _throughput as in_memory
    from gpuhealth.controller.compose import build_controller
    from gpuhealth.controller.kube.client import make_api_client
    from gpuhealth.controller.kube.rest import request
    from localkube import ControlPlane
    from localkube.kwok import Kwok
    from localkube.objects import create_namespace, gpu_node_body

    helpers: Any = importlib.import_module("tests.integration.remediation_helpers")
    out: dict[str, list[float]] = {}
    async with ControlPlane() as cp, Kwok(cp):
        admin = await make_api_client(str(cp.kubeconfig))
        await helpers.install_crd(admin)
        names = [f"bench-rem-{i:04d}" for i in range(NODES)]
        await _limited(
            names,
            lambda n: request(admin, "POST", "/api/v1/nodes", body=gpu_node_body(n, gpus=8)),
        )
        await create_namespace(admin, NAMESPACE)
        cfg = _config(str(cp.kubeconfig))
        api = await make_api_client(cfg.kubeconfig)
        rss0 = _rss_mib()
        ctl = build_controller(cfg, api)
        beat: asyncio.Task[None] | None = None
        await ctl.start()
        try:
            await asyncio.wait_for(ctl.parts.cache.synced.wait(), 60)
            agents = [SimAgent(n, ctl.parts.stream) for n in names]
            for a in agents:
                a.connect()
            beat = asyncio.create_task(heartbeats(agents), name="bench-agent-heartbeats")
            await _settle(ctl)
            for faults, reps in ROUNDS:
                for rep in range(reps):
                    r = await _round(admin, ctl, agents[:faults], f"{faults}-{rep}")
                    for k, v in r.items():
                        out.setdefault(f"remediation_kube_{faults}_{k}", []).append(v)
                    await _clean(admin, ctl)
                    if faults == NODES:
                        mem = await in_memory()
                        ratio = mem["remediation_throughput_episodes_per_s"] / r["rate"]
                        out.setdefault("remediation_kube_vs_in_memory", []).append(ratio)
            out["remediation_kube_rss_growth_mib"] = [_rss_mib() - rss0]
        finally:
            if beat is not None:
                beat.cancel()
            await ctl.stop()
            await api.close()
            await admin.close()
    return out


TARGETS = {
    100: {"rate": 5.0, "p50": 30.0, "p99": 30.0, "cpu": 15.0},
    NODES: {"rate": 5.0, "p50": 300.0, "p99": 300.0, "cpu": 150.0},
}
"""Regression guards, about twice the figures of the first runs on the 2-core reference machine
(shared, load ~4) rather than product goals: 100 faults 7-8 episodes/s, p99 13-14 s, 6-7 s
CPU; 1,000 faults 5.4-6.4 episodes/s, p99 157-183 s, 76-86 s CPU."""


def _targets() -> tuple[Target, ...]:
    units = {
        "rate": ("episodes/s", ">="),
        "p50": ("s", "<="),
        "p99": ("s", "<="),
        "cpu": ("s", "<="),
    }
    rows = [
        Target(f"remediation_kube_{faults}_{k}", units[k][0], limit, units[k][1])  # type: ignore[arg-type]
        for faults, limits in TARGETS.items()
        for k, limit in limits.items()
    ]
    return (
        *rows,
        Target("remediation_kube_vs_in_memory", "x", 60.0, "<="),
        Target("remediation_kube_rss_growth_mib", "MiB", 200.0, "<="),
    )


BENCHMARKS = [
    Benchmark(
        name="remediation_kube_1000_nodes",
        targets=_targets(),
        run=_run,
        needs_kube=True,
        repeats=1,
    ),
]
