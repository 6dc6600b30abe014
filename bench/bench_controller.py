"""Controller benchmarks against a real kube-apiserver + etcd (localkube), plain Node objects.

- ``fault_to_taint_ms`` p50/p99: a fault Event fed to the fleet (what the stream server does
  with an agent's Event) -> the taint observed through a separate watch on the API server.
  One fault at a time, 200 faults over 50 nodes; breaker off.
- ``taint_throughput_nodes_per_s``: 1,000 nodes, all reporting healthy (labels and
  conditions written), then every one turns unhealthy at once; nodes per second from the
  first fault to the 1,000th taint seen by the watch. Median of 3 rounds (recovering all
  nodes between rounds); breaker off, DRA on as in production (no ResourceSlices).
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

PREFIX = "gpuhealth.io/"
LATENCY_NODES = 50
LATENCY_FAULTS = 200
THROUGHPUT_NODES = 1000
THROUGHPUT_ROUNDS = 3
CREATE_CONCURRENCY = 32


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[idx]


class TaintWatch:
    """Follows every node's gpuhealth taints through its own watch; wakes waiters."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.tainted: dict[str, float] = {}
        """Node -> perf_counter() when a taint of ours first showed (dropped on untaint)."""
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
                    if ours and name not in self.tainted:
                        self.tainted[name] = time.perf_counter()
                        self._changed.set()
                    elif not ours and name in self.tainted:
                        del self.tainted[name]
                        self._changed.set()
            finally:
                resp.release()

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


async def _with_controller(nodes: int, body: Callable[..., Any]) -> dict[str, float]:
    from gpuhealth.controller.compose import build_controller
    from gpuhealth.controller.config import load_config
    from gpuhealth.controller.kube.client import make_api_client
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
            result: dict[str, float] = await body(ctl, watch, names, events, env)
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
) -> dict[str, float]:
    samples: list[float] = []
    for i in range(LATENCY_FAULTS):
        node = names[i % len(names)]
        t0 = time.perf_counter()
        ctl.parts.fleet.on_message(node, events[node](env.next_seq(), True))
        await watch.until(lambda n=node: n in watch.tainted, 10)  # type: ignore[misc]
        samples.append((watch.tainted[node] - t0) * 1000)
        ctl.parts.fleet.on_message(node, events[node](env.next_seq(), False))
        await watch.until(lambda n=node: n not in watch.tainted, 10)  # type: ignore[misc]
        await _settle(ctl, 30)
    return {
        "fault_to_taint_ms_p50": statistics.median(samples),
        "fault_to_taint_ms_p99": _percentile(samples, 99),
    }


async def _throughput(
    ctl: Any, watch: TaintWatch, names: list[str], events: Any, env: _Env
) -> dict[str, float]:
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
    return {"taint_throughput_nodes_per_s": statistics.median(rates)}


async def run_latency() -> dict[str, float]:
    return await _with_controller(LATENCY_NODES, _latency)


async def run_throughput() -> dict[str, float]:
    return await _with_controller(THROUGHPUT_NODES, _throughput)


BENCHMARKS = [
    Benchmark(
        name="controller_fault_to_taint",
        targets=(
            Target("fault_to_taint_ms_p50", "ms", 100, "<="),
            Target("fault_to_taint_ms_p99", "ms", 100, "<="),
        ),
        run=run_latency,
        needs_kube=True,
    ),
    Benchmark(
        name="controller_taint_throughput",
        targets=(Target("taint_throughput_nodes_per_s", "nodes/s", 200, ">="),),
        run=run_throughput,
        needs_kube=True,
    ),
]
