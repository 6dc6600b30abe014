"""Controller benchmarks against a real kube-apiserver + etcd (localkube), plain Node objects.

- ``fault_to_taint_ms`` p50/p99: a fault Event fed to the fleet (what the stream server does
  with an agent's Event) -> the taint observed through a separate watch on the API server.
  One fault at a time, 100 faults over 50 nodes per repetition, 3 repetitions in one control
  plane; breaker off.
- ``fault_to_taint_vs_api_write``: the median fault-to-taint time divided by the median time
  of a baseline measured in the same repetition, alternating with the faults: this process
  patches a label on a node and times until the same watch shows it. The baseline is the API
  server's own share (a write and its watch event), so the ratio is the cost of gpuhealth's
  path (fleet, policy, queue, plan) on top, whatever the load on the machine.
- ``taint_throughput_nodes_per_s``: 1,000 nodes, all reporting healthy (labels and
  conditions written), then every one turns unhealthy at once; nodes per second from the
  first fault to the 1,000th taint seen by the watch. 3 rounds (recovering all nodes between
  rounds); breaker off, DRA on as in production (no ResourceSlices).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from bench.registry import Benchmark, Target
from bench.stats import percentile

PREFIX = "gpuhealth.io/"
LATENCY_NODES = 50
LATENCY_FAULTS = 100
"""Faults per repetition (each paired with a baseline API write)."""
LATENCY_REPETITIONS = 3
API_WRITE_RATIO = 3.0
"""Target: fault to taint costs at most this many plain API writes seen through a watch
(1.3-1.5 measured on the 2-core reference machine)."""
MARK_LABEL = "bench.gpuhealth.io/mark"
THROUGHPUT_NODES = 1000
THROUGHPUT_ROUNDS = 3
CREATE_CONCURRENCY = 32


class TaintWatch:
    """Follows every node's gpuhealth taints through its own watch; wakes waiters."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.tainted: dict[str, float] = {}
        """Node -> perf_counter() when a taint of ours first showed (dropped on untaint)."""
        self.marks: dict[str, tuple[str, float]] = {}
        """Node -> (its MARK_LABEL value, perf_counter() when the watch first showed it)."""
        self._changed = asyncio.Event()

    async def run(self) -> None:
        from gpuhealth.controller.kube.rest import open_request, request

        data = await request(self._api, "GET", "/api/v1/nodes")
        rv = data["metadata"]["resourceVersion"]
        decoder = msgspec.json.Decoder()
        while True:
            resp = await open_request(
                self._api,
                "GET",
                "/api/v1/nodes",
                query=[("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "600")],
                timeout_s=(10.0, 700.0),
            )
            try:
                async for line in resp.content:
                    ev = decoder.decode(line)
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    name = obj["metadata"]["name"]
                    ours = any(
                        t["key"].startswith(PREFIX) for t in obj.get("spec", {}).get("taints") or ()
                    )
                    mark = (obj["metadata"].get("labels") or {}).get(MARK_LABEL)
                    if mark is not None and self.marks.get(name, ("",))[0] != mark:
                        self.marks[name] = (mark, time.perf_counter())
                        self._changed.set()
                    if ours and name not in self.tainted:
                        self.tainted[name] = time.perf_counter()
                        self._changed.set()
                    elif not ours and name in self.tainted:
                        del self.tainted[name]
                        self._changed.set()
            finally:
                resp.release()

    async def mark(self, node: str, value: str) -> float:
        """The baseline: patch ``MARK_LABEL`` on ``node`` and time (ms) until this watch
        shows it."""
        from gpuhealth.controller.kube.rest import MERGE_PATCH, request

        t0 = time.perf_counter()
        await request(
            self._api,
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": {MARK_LABEL: value}}},
            content_type=MERGE_PATCH,
        )
        await self.until(lambda: self.marks.get(node, ("",))[0] == value, 10)
        return (self.marks[node][1] - t0) * 1000

    async def until(self, cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("condition not reached")
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                continue


async def _create_nodes(api: Any, names: list[str]) -> None:
    from gpuhealth.controller.kube.rest import request
    from localkube.objects import gpu_node_body

    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(name: str) -> None:
        async with sem:
            await request(api, "POST", "/api/v1/nodes", body=gpu_node_body(name, kwok=False))

    await asyncio.gather(*(one(n) for n in names))


def _messages(node: str) -> tuple[Any, Any, Callable[[int, bool], Any]]:
    from gpuhealth.protocol import Condition, Event, GpuInfo, GpuStatus, Hello, Snapshot

    infos = [GpuInfo(index=i, uuid=f"GPU-{node}-{i}") for i in range(8)]
    hello = Hello(seq=1, node=node, stream_id="b", boot_id="b", agent_version="bench", gpus=infos)
    snap = Snapshot(
        seq=2,
        node=node,
        taken_at=datetime.now(UTC),
        gpus=[GpuStatus(info=g, state="healthy") for g in infos],
    )
    xid = Condition(reason="XidError", code="xid-79", severity="unhealthy")

    def event(seq: int, bad: bool) -> Event:
        return Event(
            seq=seq,
            node=node,
            at=datetime.now(UTC),
            kind="transition",
            gpu_uuid=infos[3].uuid,
            gpu_index=3,
            previous="healthy" if bad else "unhealthy",
            current="unhealthy" if bad else "healthy",
            conditions=[xid] if bad else [],
        )

    return hello, snap, event


class _Env:
    def __init__(self) -> None:
        self.seq = 10

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


async def _with_controller(nodes: int, body: Callable[..., Any]) -> dict[str, list[float]]:
    from gpuhealth.controller.compose import build_controller
    from gpuhealth.controller.kube.client import make_api_client
    from gpuhealth.controller.settings import load_config
    from localkube import ControlPlane

    async with ControlPlane() as cp:
        admin = await make_api_client(str(cp.kubeconfig))
        names = [f"bench-gpu-{i:05d}" for i in range(nodes)]
        await _create_nodes(admin, names)
        cfg = load_config(
            None,
            {
                "kubeconfig": str(cp.kubeconfig),
                "leader": {"enabled": False},
                "breaker": {"enabled": False},
                "extender": {"enabled": False},
            },
        )
        api = await make_api_client(cfg.kubeconfig)
        ctl = build_controller(cfg, api)
        watch = TaintWatch(admin)
        watch_task = asyncio.create_task(watch.run(), name="bench-taint-watch")
        await ctl.start()
        try:
            await asyncio.wait_for(ctl.parts.cache.synced.wait(), 60)
            env = _Env()
            events = {}
            for n in names:
                hello, snap, event = _messages(n)
                ctl.parts.fleet.on_connect(n, hello)
                ctl.parts.fleet.on_message(n, snap)
                events[n] = event
            await _settle(ctl, 300)
            result: dict[str, list[float]] = await body(ctl, watch, names, events, env)
            return result
        finally:
            watch_task.cancel()
            await ctl.stop()
            await api.close()
            await admin.close()


async def _settle(ctl: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ctl.parts.reconciler.idle():
        if time.monotonic() > deadline:
            raise TimeoutError("reconciler did not settle")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


async def _latency(
    ctl: Any, watch: TaintWatch, names: list[str], events: Any, env: _Env
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for rep in range(LATENCY_REPETITIONS):
        samples: list[float] = []
        baseline: list[float] = []
        for i in range(LATENCY_FAULTS):
            node = names[i % len(names)]
            t0 = time.perf_counter()
            ctl.parts.fleet.on_message(node, events[node](env.next_seq(), True))
            await watch.until(lambda n=node: n in watch.tainted, 10)  # type: ignore[misc]
            samples.append((watch.tainted[node] - t0) * 1000)
            ctl.parts.fleet.on_message(node, events[node](env.next_seq(), False))
            await watch.until(lambda n=node: n not in watch.tainted, 10)  # type: ignore[misc]
            await _settle(ctl, 30)
            baseline.append(await watch.mark(names[(i + 1) % len(names)], f"{rep}-{i}"))
        out.setdefault("fault_to_taint_ms_p50", []).append(statistics.median(samples))
        out.setdefault("fault_to_taint_ms_p99", []).append(percentile(samples, 99))
        out.setdefault("fault_to_taint_vs_api_write", []).append(
            statistics.median(samples) / statistics.median(baseline)
        )
    return out


async def _throughput(
    ctl: Any, watch: TaintWatch, names: list[str], events: Any, env: _Env
) -> dict[str, list[float]]:
    rates: list[float] = []
    for _ in range(THROUGHPUT_ROUNDS):
        t0 = time.perf_counter()
        for n in names:
            ctl.parts.fleet.on_message(n, events[n](env.next_seq(), True))
        await watch.until(lambda: len(watch.tainted) >= len(names), 120)
        t_last = max(watch.tainted[n] for n in names)
        rates.append(len(names) / (t_last - t0))
        await _settle(ctl, 300)
        for n in names:
            ctl.parts.fleet.on_message(n, events[n](env.next_seq(), False))
        await watch.until(lambda: not watch.tainted, 120)
        await _settle(ctl, 300)
    return {"taint_throughput_nodes_per_s": rates}


async def run_latency() -> dict[str, list[float]]:
    return await _with_controller(LATENCY_NODES, _latency)


async def run_throughput() -> dict[str, list[float]]:
    return await _with_controller(THROUGHPUT_NODES, _throughput)


BENCHMARKS = [
    Benchmark(
        name="controller_fault_to_taint",
        targets=(
            Target("fault_to_taint_ms_p50", "ms", 100, "<="),
            Target("fault_to_taint_ms_p99", "ms", 100, "<="),
            Target("fault_to_taint_vs_api_write", "x", API_WRITE_RATIO, "<="),
        ),
        run=run_latency,
        needs_kube=True,
        repeats=1,
    ),
    Benchmark(
        name="controller_taint_throughput",
        targets=(Target("taint_throughput_nodes_per_s", "nodes/s", 200, ">="),),
        run=run_throughput,
        needs_kube=True,
        repeats=1,
    ),
]
