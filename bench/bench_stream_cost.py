"""The controller's cost per connected agent: heap per connection, CPU per Heartbeat.

The real stream server (fake authenticator behind the real review cache, as in
``bench_stream``) in its own process, its sink the real
:class:`~gpuhealth.controller.fleet.model.Fleet` with the placement index and the idle tracker
following it (as ``compose`` wires them); ``AGENTS`` WebSocket clients in another process each say
Hello (8 GPUs), send a Snapshot (8 healthy GPUs with telemetry, 8 allocations), then a Heartbeat
(the same telemetry, 8 allocations' usage) every ``HEARTBEAT_S`` seconds at a random phase.

- ``controller_heap_kib_per_agent``: the server started with ``tracemalloc``; Python heap
  after all agents are connected and have sent a Heartbeat, less the heap before the first
  one connected, per agent (garbage collected first). 3 repetitions.
- ``controller_cpu_us_per_heartbeat``: the server without ``tracemalloc``, on uvloop (as the
  controller runs); its user+system
  CPU time over a ``WINDOW_S`` window once all are connected, divided by the Heartbeats it
  applied in that window (everything the process does: sockets, aiohttp, the event loop,
  our code; every 3rd Heartbeat acknowledged, as by default). 3 repetitions.
- ``heartbeat_ingest_us``: our own code alone, in this process: one Heartbeat frame through
  ``Session.on_frame`` into the same fleet, placement index and idle tracker, 500 nodes x 100
  Heartbeats; 5 runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import socket
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench.bench_stream import _NodeFromToken, _raise_nofile
from bench.registry import Benchmark, Target

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
AGENTS = 1_000
GPUS = 8
HEARTBEAT_S = 1.0
WINDOW_S = 10.0


def _gpus(node: str) -> list[Any]:
    from gpuhealth.protocol import GpuInfo, GpuStatus, GpuTelemetry

    return [
        GpuStatus(
            info=GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H100 80GB HBM3"),
            state="healthy",
            telemetry=GpuTelemetry(
                uuid=f"GPU-{node}-{i}",
                temperature_c=40.0 + i,
                slowdown_temperature_c=87.0,
                shutdown_temperature_c=92.0,
                power_w=350.0,
                utilization_ratio=0.5,
                memory_bandwidth_ratio=0.3,
                sbe_recent=0,
            ),
        )
        for i in range(GPUS)
    ]


def _frames(node: str) -> tuple[bytes, bytes, Any]:
    """Hello, Snapshot, and a function of ``seq`` making the node's Heartbeat."""
    from gpuhealth.protocol import Allocation, AllocationUsage, Heartbeat, Hello, Snapshot, encode

    gpus = _gpus(node)
    allocations = [
        Allocation(
            namespace="ml-team",
            pod=f"trainer-{node}",
            container="main",
            device_id=g.info.uuid,
            gpu_uuid=g.info.uuid,
        )
        for g in gpus
    ]
    hello = Hello(
        seq=1,
        node=node,
        stream_id="s",
        boot_id="b",
        agent_version="bench",
        gpus=[g.info for g in gpus],
        expected_gpus=GPUS,
        capabilities=[],
    )
    snapshot = Snapshot(seq=2, node=node, taken_at=AT, gpus=gpus, allocations=allocations)
    telemetry = [g.telemetry for g in gpus]
    usage = [
        AllocationUsage(
            namespace="ml-team",
            pod=f"trainer-{node}",
            container="main",
            gpu_uuid=g.info.uuid,
            utilization_ratio=0.9,
            samples=10,
        )
        for g in gpus
    ]

    def heartbeat(seq: int) -> bytes:
        return encode(Heartbeat(seq=seq, node=node, at=AT, usage=usage, telemetry=telemetry))

    return encode(hello), encode(snapshot), heartbeat


def _controller_fleet() -> tuple[Any, Any, Any]:
    """The fleet with what follows it in the controller: placement index, idle tracker."""
    from gpuhealth.controller.fleet.model import Fleet
    from gpuhealth.controller.idle.tracker import IdleTracker
    from gpuhealth.controller.placement.view import PlacementIndex

    fleet = Fleet()
    placement = PlacementIndex(fleet)
    idle = IdleTracker(should_act=lambda: False)
    idle.attach(fleet)
    return fleet, placement, idle


# -- the server process ------------------------------------------------------------------------


def _serve(port: int, trace: bool) -> None:
    from aiohttp import web

    from gpuhealth.controller.stream.server import StreamServer
    from gpuhealth.controller.stream.settings import StreamServerSettings

    _raise_nofile()
    if trace:
        tracemalloc.start()
    s = StreamServerSettings()
    user = f"system:serviceaccount:{s.agent_namespace}:{s.agent_service_account}"
    fleet, _placement, _idle = _controller_fleet()
    server = StreamServer(s, _NodeFromToken(user), fleet)  # type: ignore[arg-type]
    app = web.Application()
    server.add_routes(app)

    async def stats(_req: web.Request) -> web.Response:
        gc.collect()
        heap = tracemalloc.get_traced_memory()[0] if trace else 0
        cpu = os.times()
        return web.json_response(
            {
                "connections": len(server.connections),
                "heartbeats": server.metrics.messages["heartbeat"],
                "heap": heap,
                "cpu_s": cpu.user + cpu.system,
            }
        )

    app.router.add_get("/stats", stats)
    # the controller's event loop (``event_loop``: uvloop) for the CPU; for the heap asyncio's,
    # whose transports tracemalloc sees (uvloop's are C allocations; fleet_scale's RSS has all)
    loop = asyncio.new_event_loop() if trace else uvloop.new_event_loop()
    web.run_app(
        app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096, loop=loop
    )


# -- the clients process -----------------------------------------------------------------------


async def _clients(port: int, n: int, seconds: float) -> None:
    import aiohttp

    _raise_nofile()
    url = f"http://127.0.0.1:{port}/v1/stream"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        sem = asyncio.Semaphore(50)
        agents: list[tuple[aiohttp.ClientWebSocketResponse, Any]] = []

        async def connect(i: int) -> None:
            node = f"node-{i}"
            hello, snapshot, heartbeat = _frames(node)
            async with sem:
                ws = await http.ws_connect(
                    url, headers={"Authorization": f"Bearer tok-{node}"}, heartbeat=None
                )
                await ws.send_bytes(hello)
                await ws.receive()
                await ws.send_bytes(snapshot)
                await ws.receive()
                await ws.send_bytes(heartbeat(3))
                agents.append((ws, heartbeat))

        await asyncio.gather(*(connect(i) for i in range(n)))
        print("ready", flush=True)

        async def beat(ws: aiohttp.ClientWebSocketResponse, heartbeat: Any) -> None:
            await asyncio.sleep(random.uniform(0, HEARTBEAT_S))
            seq = 3
            while True:
                seq += 1
                await ws.send_bytes(heartbeat(seq))
                await asyncio.sleep(HEARTBEAT_S)

        async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
            async for _ in ws:  # acks
                pass

        tasks = [asyncio.create_task(read(ws)) for ws, _ in agents]
        if sys.stdin.readline().strip() == "beat":
            tasks += [asyncio.create_task(beat(ws, hb)) for ws, hb in agents]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()


async def _stats(port: int) -> dict[str, float]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/stats") as resp,
    ):
        data: dict[str, float] = await resp.json()
        return data


async def _run_pair(trace: bool) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    me = [sys.executable, "-m", "bench.bench_stream_cost"]
    server = subprocess.Popen(
        [*me, "serve", "--port", str(port), *(["--trace"] if trace else [])],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients: subprocess.Popen[str] | None = None
    try:
        for _ in range(100):
            try:
                start = await _stats(port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the server did not start")
        clients = subprocess.Popen(
            [*me, "clients", "--port", str(port), "--n", str(AGENTS), "--seconds", "60"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert clients.stdout is not None and clients.stdin is not None
        line = await asyncio.wait_for(asyncio.to_thread(clients.stdout.readline), 120)
        if line.strip() != "ready":
            raise RuntimeError(f"clients did not connect: {line!r}")
        for _ in range(100):  # every agent's first Heartbeat applied
            connected = await _stats(port)
            if connected["heartbeats"] >= AGENTS:
                break
            await asyncio.sleep(0.1)
        if connected["connections"] < AGENTS:
            raise RuntimeError(f"only {connected['connections']} connected")
        if trace:
            clients.stdin.close()
            return {
                "controller_heap_kib_per_agent": (connected["heap"] - start["heap"]) / 1024 / AGENTS
            }
        clients.stdin.write("beat\n")
        clients.stdin.flush()
        await asyncio.sleep(HEARTBEAT_S * 2)  # every agent beating
        before = await _stats(port)
        await asyncio.sleep(WINDOW_S)
        after = await _stats(port)
        beats = after["heartbeats"] - before["heartbeats"]
        if beats < 0.5 * AGENTS * WINDOW_S / HEARTBEAT_S:
            raise RuntimeError(f"load not as specified: {beats} heartbeats")
        return {"controller_cpu_us_per_heartbeat": 1e6 * (after["cpu_s"] - before["cpu_s"]) / beats}
    finally:
        for p in (clients, server):
            if p is not None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


async def _heap() -> dict[str, float]:
    return await _run_pair(trace=True)


async def _cpu() -> dict[str, float]:
    return await _run_pair(trace=False)


# -- our own code alone ------------------------------------------------------------------------


def ingest_setup(nodes: int) -> tuple[list[Any], list[Any], Any]:
    """``nodes`` sessions past Hello and Snapshot into the controller's fleet; their Heartbeat
    makers; the placement index."""
    from gpuhealth.controller.stream.metrics import StreamServerMetrics
    from gpuhealth.controller.stream.session import SeqTracker, Session, TokenBucket
    from gpuhealth.protocol import Hello
    from gpuhealth.protocol.codec import decode_agent

    fleet, placement, _idle = _controller_fleet()
    tracker, metrics = SeqTracker(), StreamServerMetrics()
    sessions, makers = [], []
    for i in range(nodes):
        hello, snapshot, heartbeat = _frames(f"node-{i}")
        h = decode_agent(hello)
        assert isinstance(h, Hello)
        session = Session(
            h, fleet, tracker, metrics, TokenBucket(1e9, 1e9, 0.0), heartbeat_ack_every=3
        )
        fleet.on_connect(h.node, h)
        session.on_frame(snapshot, 0.0)
        sessions.append(session)
        makers.append(heartbeat)
    return sessions, makers, placement


def _ingest_once(nodes: int, beats: int) -> float:
    from gpuhealth.protocol import encode

    sessions, makers, _placement = ingest_setup(nodes)
    frames = [(sessions[n], makers[n](seq)) for seq in range(3, 3 + beats) for n in range(nodes)]
    t0 = time.process_time()
    for session, frame in frames:
        reply = session.on_frame(frame, 0.0)
        if reply.ack is not None:
            encode(reply.ack)
    return 1e6 * (time.process_time() - t0) / len(frames)


async def _ingest() -> dict[str, list[float]]:
    return {"heartbeat_ingest_us": [_ingest_once(500, 100) for _ in range(5)]}


BENCHMARKS = [
    Benchmark(
        name="stream_heap_per_agent",
        targets=(Target("controller_heap_kib_per_agent", "KiB", 25, "<="),),
        run=_heap,
        repeats=3,
    ),
    Benchmark(
        name="stream_cpu_per_heartbeat",
        targets=(Target("controller_cpu_us_per_heartbeat", "us", 100, "<="),),
        run=_cpu,
        repeats=3,
    ),
    Benchmark(
        name="stream_heartbeat_ingest",
        targets=(Target("heartbeat_ingest_us", "us", 25, "<="),),
        run=_ingest,
        repeats=1,
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "clients"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=AGENTS)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    if args.mode == "serve":
        _serve(args.port, args.trace)
    else:
        asyncio.run(_clients(args.port, args.n, args.seconds))


if __name__ == "__main__":
    main()
