"""The fleet API and the status page's overview at fleet scale, served in-process.

A fleet of N nodes x 8 GPUs (about 1 % of GPUs unhealthy, their nodes tainted, two node
pools) is served by the controller's real handlers (``ApiV1`` over the fleet cache, the
``StatusPage``) on a local aiohttp server; a client in another thread asks and reads the
raw bytes (gzip accepted), so the server's event loop does only the server's work. Before
each request a fifth of the nodes send a heartbeat (what a page polling every 2 s finds with
heartbeats every 10 s), so every request re-encodes the fragments of the nodes it answers
that changed. A ticker on the server's loop records the most CPU time the loop's thread
spent between two of its turns (the loop's block: what a Lease renewal, a heartbeat or a
fault waits behind; CPU time, so that the shared machine's other load does not count as the
request's). The garbage collector runs a full collection before each request, outside the
measurement: at 20,000 nodes one takes 100-200 ms whoever triggers it, which is the heap's
cost, not the request's.

For N = 5,000 and 20,000, alternated in the same run:

- ``fleet_<N>_ms_p50``, ``fleet_<N>_block_ms``, ``fleet_<N>_wire_mb``: ``GET /api/v1/fleet``
  (the whole fleet, gzip): latency to the last byte, the loop's longest block, bytes sent;
- ``whole_fleet_<N>_block_ms``: the same request answered the way it was before the cache
  (the whole document built and encoded in the handler), and ``fleet_<N>_block_vs_whole``
  the ratio of the two blocks (interleaved rounds of the same run);
- ``fleet_all_changed_<N>_ms`` and ``_block_ms``: the same after every node sent a heartbeat
  (the first request after a quiet spell: every node re-encoded, a slice at a time);
- ``fleet_page_<N>_ms_p50``: one page of 500 nodes (``limit=500``) from the middle;
- ``overview_<N>_ms_p50``, ``overview_<N>_block_ms``, ``overview_<N>_wire_kb``: the status
  page's poll (not cached between rounds: ``cache_s`` 0);
- ``fleet_cache_<N>_mib``: the encoded fragments the cache keeps;
- ``fleet_<N>_peak_mib`` and ``whole_fleet_<N>_peak_mib``: the most memory allocated at once
  while answering the whole fleet, each way (tracemalloc, one request each), and
  ``fleet_<N>_peak_vs_whole`` their ratio.

Also ``status_table_ms_p50``: rendering ``gpuhealth-controller status`` for 5,000 nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.client
import time
import tracemalloc
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from bench.registry import Benchmark, Target
from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.query import encode_continue
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.http.api import FLEET_PATH, ApiV1, fleet_json, node_fragment
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import Keys
from gpuhealth.controller.status_cli import render_table
from gpuhealth.controller.status_page.page import OVERVIEW_PATH, StatusPage
from gpuhealth.protocol import (
    Condition,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Heartbeat,
    Hello,
    Snapshot,
)
from tests.support.clock import FakeClock

SIZES = (5000, 20000)
GPUS = 8
ROUNDS = 5
"""Requests of each kind per size."""
WHOLE_ROUNDS = 3
"""Requests answered the old way per size (each takes seconds at 20,000 nodes)."""
CHURN = 0.2
"""Fraction of the nodes that send a heartbeat before each request."""
PAGE = 500
TICK_S = 0.001
PREFIX = "gpuhealth.io"
POOL = "karpenter.sh/nodepool"
XID79 = Condition(reason="XidError", code="xid-79", severity="unhealthy", action="RESTART_BM")
RENEW_DEADLINE_MS = 10_000.0
"""The baseline's target: the Lease's renewal deadline (``leader.renew_deadline_s``), which
the whole document built at once approaches at 20,000 nodes on the reference machine."""
BLOCK_MS = 100.0
"""Target: the longest a request holds the event loop (the Lease's renewal deadline is 10 s;
a heartbeat's or a fault's handling should not wait longer than this)."""


class _Views:
    def __init__(self, views: list[NodeView]) -> None:
        self._by_name = {v.name: v for v in views}

    def views(self) -> list[NodeView]:
        return list(self._by_name.values())

    def get(self, name: str) -> NodeView | None:
        return self._by_name.get(name)

    def subscribe(self, listener: Any) -> None:
        pass


def _fleet(n_nodes: int, clock: FakeClock) -> tuple[Fleet, _Views]:
    fleet = Fleet(clock=clock)
    now = datetime.now(UTC)
    views = []
    for n in range(n_nodes):
        name = f"gpu-node-{n}"
        infos = [
            GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100", pci_bus_id=f"0000:{i:02x}:00.0")
            for i in range(GPUS)
        ]
        fleet.on_connect(
            name, Hello(seq=1, node=name, stream_id="s", boot_id="b", agent_version="b", gpus=infos)
        )
        snap = Snapshot(
            seq=2, node=name, taken_at=now, gpus=[GpuStatus(info=g, state="healthy") for g in infos]
        )
        fleet.on_message(name, snap)
        fleet.on_message(name, _heartbeat(n, 3))
        taints: tuple[dict[str, str], ...] = ()
        if n % 12 == 0:  # ~1 % of GPUs
            fleet.on_message(
                name,
                Event(seq=4, node=name, at=now, kind="transition", gpu_uuid=f"GPU-{n}-3",
                      gpu_index=3, previous="healthy", current="unhealthy", conditions=[XID79]),
            )  # fmt: skip
            taints = ({"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"},)
        labels = {POOL: "h100-a" if n % 2 else "h100-b"}
        views.append(
            NodeView(name=name, resource_version="1", labels=labels, taints=taints, gpus=GPUS)
        )
    return fleet, _Views(views)


def _heartbeat(n: int, seq: int) -> Heartbeat:
    return Heartbeat(
        seq=seq,
        node=f"gpu-node-{n}",
        at=datetime.now(UTC),
        telemetry=[
            GpuTelemetry(
                uuid=f"GPU-{n}-{i}",
                temperature_c=40.0 + (seq + i) % 30,
                power_w=350.0,
                utilization_ratio=0.9,
                memory_bandwidth_ratio=0.5,
                sbe_recent=0,
            )
            for i in range(GPUS)
        ],
    )


class _Ticker:
    """The most CPU time the loop's thread spent between two turns of this task: what one
    stretch of work held the loop (time waiting for a CPU the machine's other load holds is
    not counted; on an idle machine the two are the same)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            last = now

    def start(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.longest * 1000


def _get(port: int, path: str) -> tuple[float, int]:
    """Blocking GET from another thread: (seconds to the last byte, bytes on the wire)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - t0
    conn.close()
    assert resp.status == 200, (resp.status, body[:200])
    return elapsed, len(body)


class _Served:
    def __init__(self, n_nodes: int) -> None:
        self.n = n_nodes
        self.clock = FakeClock()
        self.fleet, self.views = _fleet(n_nodes, self.clock)
        keys = Keys(PREFIX)
        self.cache = FleetCache(self.fleet, self.views, keys, node_fragment)
        breaker = CircuitBreaker(BreakerSettings(), self.clock)
        self.api = ApiV1(
            cache=self.cache,
            breaker_status=breaker.status,
            reset_breaker_and_requeue=list,
            is_leader=lambda: True,
            dry_run=False,
            clock=self.clock,
        )
        self.page = StatusPage(
            fleet=self.fleet, keys=keys, nodes=self.views, clock=self.clock, cache_s=0.0,
            fleet_cache=self.cache,
        )  # fmt: skip
        self.seq = 10
        self.cache.refresh_all()

    async def whole(self, _req: web.Request) -> web.Response:
        """The handler as it was: the whole document built and encoded on the loop."""
        view = build_fleet_view(self.fleet, self.views.views(), Keys(PREFIX))
        doc = fleet_json(
            view, self.api.breaker_document(), now=self.clock.now(),
            now_mono=self.clock.monotonic(), leader=True, dry_run=False,
        )  # fmt: skip
        return web.json_response(doc)

    def churn(self, every: bool = False) -> None:
        self.seq += 1
        step = 1 if every else int(1 / CHURN)
        for n in range(self.seq % step, self.n, step):
            self.fleet.on_message(f"gpu-node-{n}", _heartbeat(n, self.seq))

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(self.api.routes())
        self.page.add_routes(app)
        app.router.add_get("/whole", self.whole)
        return app


async def _request(
    port: int, path: str, served: _Served, *, every: bool = False
) -> tuple[float, int, float]:
    served.churn(every)
    gc.collect()  # a full collection of the fleet's heap is not the request's doing
    ticker = _Ticker()
    ticker.start()
    elapsed, size = await asyncio.to_thread(_get, port, path)
    return elapsed * 1000, size, await ticker.stop()


async def _measure(n_nodes: int, out: dict[str, list[float]]) -> None:
    served = _Served(n_nodes)
    out.setdefault(f"fleet_cache_{n_nodes}_mib", []).append(
        sum(len(e.fragment) for e in served.cache.entries()) / 2**20
    )
    runner = web.AppRunner(served.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    middle = f"gpu-node-{n_nodes // 2}"
    page_path = f"{FLEET_PATH}?limit={PAGE}&continue={encode_continue(middle)}"
    try:
        for _ in range(WHOLE_ROUNDS):
            ms, _, block = await _request(port, FLEET_PATH, served, every=True)
            out.setdefault(f"fleet_all_changed_{n_nodes}_ms", []).append(ms)
            out.setdefault(f"fleet_all_changed_{n_nodes}_block_ms", []).append(block)
        for i in range(max(ROUNDS, WHOLE_ROUNDS)):
            if i < WHOLE_ROUNDS:
                _, _, block = await _request(port, "/whole", served)
                out.setdefault(f"whole_fleet_{n_nodes}_block_ms", []).append(block)
                whole_block = block
            ms, size, block = await _request(port, FLEET_PATH, served)
            out.setdefault(f"fleet_{n_nodes}_ms_p50", []).append(ms)
            out.setdefault(f"fleet_{n_nodes}_block_ms", []).append(block)
            out.setdefault(f"fleet_{n_nodes}_wire_mb", []).append(size / 1e6)
            if i < WHOLE_ROUNDS:
                out.setdefault(f"fleet_{n_nodes}_block_vs_whole", []).append(block / whole_block)
            ms, _, _ = await _request(port, page_path, served)
            out.setdefault(f"fleet_page_{n_nodes}_ms_p50", []).append(ms)
            ms, size, block = await _request(port, OVERVIEW_PATH, served)
            out.setdefault(f"overview_{n_nodes}_ms_p50", []).append(ms)
            out.setdefault(f"overview_{n_nodes}_block_ms", []).append(block)
            out.setdefault(f"overview_{n_nodes}_wire_kb", []).append(size / 1e3)
        new_peak = await _peak_mib(port, FLEET_PATH, served)
        whole_peak = await _peak_mib(port, "/whole", served)
        out.setdefault(f"fleet_{n_nodes}_peak_mib", []).append(new_peak)
        out.setdefault(f"whole_fleet_{n_nodes}_peak_mib", []).append(whole_peak)
        out.setdefault(f"fleet_{n_nodes}_peak_vs_whole", []).append(new_peak / whole_peak)
    finally:
        await runner.cleanup()


async def _peak_mib(port: int, path: str, served: _Served) -> float:
    """The most memory the process allocated at once while answering (tracemalloc; slow,
    so measured once, apart from the timed rounds)."""
    served.churn()
    gc.collect()
    tracemalloc.start()
    try:
        await asyncio.to_thread(_get, port, path)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _status_table_ms() -> list[float]:
    served = _Served(SIZES[0])
    doc = served.api.fleet_document()
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        render_table(doc)
        times.append((time.perf_counter() - t0) * 1000)
    return times


async def run() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for n in SIZES:
        await _measure(n, out)
    out["status_table_ms_p50"] = _status_table_ms()
    return out


def _targets() -> tuple[Target, ...]:
    targets: list[Target] = []
    for n in SIZES:
        big = n > SIZES[0]
        targets += [
            Target(f"fleet_{n}_ms_p50", "ms", 6000 if big else 1500, "<="),
            Target(f"fleet_{n}_block_ms", "ms", BLOCK_MS, "<="),
            Target(f"fleet_{n}_wire_mb", "MB", 20 if big else 5, "<="),
            Target(f"fleet_all_changed_{n}_ms", "ms", 20000 if big else 5000, "<="),
            Target(f"fleet_all_changed_{n}_block_ms", "ms", BLOCK_MS, "<="),
            Target(f"whole_fleet_{n}_block_ms", "ms", RENEW_DEADLINE_MS, "<="),
            Target(f"fleet_{n}_block_vs_whole", "x", 0.1, "<="),
            Target(f"fleet_page_{n}_ms_p50", "ms", 300, "<="),
            Target(f"overview_{n}_ms_p50", "ms", 300, "<="),
            Target(f"overview_{n}_block_ms", "ms", BLOCK_MS, "<="),
            Target(f"overview_{n}_wire_kb", "kB", 200, "<="),
            Target(f"fleet_cache_{n}_mib", "MiB", 200 if big else 50, "<="),
            Target(f"fleet_{n}_peak_mib", "MiB", 64, "<="),
            Target(f"whole_fleet_{n}_peak_mib", "MiB", 2048, "<="),
            Target(f"fleet_{n}_peak_vs_whole", "x", 0.25, "<="),
        ]
    return (*targets, Target("status_table_ms_p50", "ms", 500, "<="))


BENCHMARKS = [
    Benchmark(name="web_fleet_and_overview", targets=_targets(), run=run, repeats=1),
]
