"""Stream benchmarks: controller ingest throughput, event latency, 5,000 connected agents.

- ``controller_ingest_msgs_per_s``: realistic Heartbeats (8 GPUs' telemetry, 8 allocations'
  usage) from 200 nodes through the real per-connection path (rate limit, decode, order check,
  dedupe, sink, Ack encode) in one thread; 5 runs of 40,000 frames.
- ``stream_event_latency_ms_p50`` / ``_p99``: a real agent (StreamClient, on-disk outbox with
  fsync per event) -> the real stream server on 127.0.0.1 -> the sink; 300 events 5 ms apart,
  timed from ``publish`` to ``on_message``. Server and agent share one event loop; 5
  repetitions.
- ``controller_cpu_percent_5000_agents`` / ``controller_rss_mib_5000_agents``: the stream
  server alone in its own process (``python -m bench.bench_stream serve``) with a *fake*
  authenticator (no API server; tokens name their node) behind the real review cache; 5,000
  WebSocket clients in another process each send Hello and then a Heartbeat every 10 s (random
  phase) and, like the real agent and the server by default, no WebSocket pings (Heartbeats
  are acknowledged every 3rd, ``heartbeat_ack_every``, as configured by default). CPU is
  user+system time of the server process over a 30 s window after all are connected, in % of
  one core; RSS is VmRSS at the end of the window. The run checks that
  all 5,000 are connected and that >= 90 % of the expected heartbeats arrived; 3 repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.registry import Benchmark, Target

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
AGENTS = 5_000
HEARTBEAT_S = 10.0
WINDOW_S = 30.0


def _heartbeat(seq: int, node: str) -> bytes:
    from gpuhealth.protocol import AllocationUsage, GpuTelemetry, Heartbeat, encode

    return encode(
        Heartbeat(
            seq=seq,
            node=node,
            at=AT,
            usage=[
                AllocationUsage(
                    namespace="ml-team",
                    pod=f"trainer-{i}",
                    container="main",
                    gpu_uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666",
                    utilization_ratio=0.9,
                    samples=10,
                )
                for i in range(8)
            ],
            telemetry=[
                GpuTelemetry(
                    uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666",
                    temperature_c=61.0,
                    slowdown_temperature_c=87.0,
                    shutdown_temperature_c=92.0,
                    power_w=512.5,
                    utilization_ratio=0.93,
                    memory_bandwidth_ratio=0.41,
                    sbe_recent=0,
                )
                for i in range(8)
            ],
        )
    )


class _NullSink:
    def __init__(self) -> None:
        self.count = 0

    def on_connect(self, node: str, hello: object) -> None:
        pass

    def on_message(self, node: str, msg: object) -> None:
        self.count += 1

    def on_disconnect(self, node: str) -> None:
        pass


def _ingest_once(frames: list[tuple[int, bytes]], nodes: int) -> float:
    from gpuhealth.controller.stream.metrics import StreamServerMetrics
    from gpuhealth.controller.stream.session import SeqTracker, Session, TokenBucket
    from gpuhealth.protocol import Hello, encode

    sink, tracker, metrics = _NullSink(), SeqTracker(), StreamServerMetrics()
    sessions = [
        Session(
            Hello(seq=1, node=f"node-{i}", stream_id="s", boot_id="b", agent_version="v"),
            sink,
            tracker,
            metrics,
            TokenBucket(1e9, 1e9, 0.0),
        )
        for i in range(nodes)
    ]
    t0 = time.perf_counter()
    for node, frame in frames:
        reply = sessions[node].on_frame(frame, 0.0)
        if reply.ack is not None:
            encode(reply.ack)
    elapsed = time.perf_counter() - t0
    assert sink.count == len(frames)
    return len(frames) / elapsed


async def _ingest() -> dict[str, list[float]]:
    nodes, per_node = 200, 200
    frames = [
        (n, _heartbeat(seq, f"node-{n}")) for seq in range(1, per_node + 1) for n in range(nodes)
    ]
    runs = [_ingest_once(frames, nodes) for _ in range(5)]
    return {"controller_ingest_msgs_per_s": runs}


async def _latency() -> dict[str, float]:
    from aiohttp import web

    from gpuhealth.agent.health.transition import Transition
    from gpuhealth.agent.stream.client import HelloInfo, StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.controller.stream.auth import (
        NODE_NAME_KEY,
        POD_NAME_KEY,
        POD_UID_KEY,
        Identity,
        StaticAuthenticator,
    )
    from gpuhealth.controller.stream.server import StreamServer
    from gpuhealth.controller.stream.settings import StreamServerSettings
    from gpuhealth.protocol import (
        Allocation,
        AllocationUsage,
        Condition,
        Event,
        GpuStatus,
        GpuTelemetry,
        NicPortInfo,
    )

    arrivals: dict[int, float] = {}

    class Sink(_NullSink):
        def on_message(self, node: str, msg: object) -> None:
            if isinstance(msg, Event) and msg.xid is not None:
                arrivals[msg.xid] = time.perf_counter()

    class State:
        def hello_info(self) -> HelloInfo:
            return HelloInfo(node="bench-node", boot_id="b", agent_version="bench")

        def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
            return [], []

        def node_conditions(self) -> list[Condition]:
            return []

        def nics(self) -> list[NicPortInfo]:
            return []

        def allocations_unknown(self) -> str | None:
            return None

        def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
            return [], []

    settings = StreamServerSettings()
    user = f"system:serviceaccount:{settings.agent_namespace}:{settings.agent_service_account}"
    auth = StaticAuthenticator(
        {
            "t": Identity(
                authenticated=True,
                username=user,
                audiences=("gpuhealth",),
                extra={
                    NODE_NAME_KEY: ("bench-node",),
                    POD_NAME_KEY: ("bench-agent",),
                    POD_UID_KEY: ("bench-uid",),
                },
            )
        }
    )
    server = StreamServer(settings, auth, Sink())
    app = web.Application()
    server.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as d:
        client = StreamClient(
            StreamClientSettings(url=f"ws://127.0.0.1:{port}/v1/stream", heartbeat_interval_s=3600),
            State(),
            Outbox(d),
            lambda: "t",
        )
        task = asyncio.create_task(client.run())
        connect_by = time.monotonic() + 10
        while not client.metrics.connected:
            if task.done() or time.monotonic() > connect_by:
                task.cancel()
                raise RuntimeError(f"the stream client did not connect: {task}")
            await asyncio.sleep(0.01)
        sent: dict[int, float] = {}
        for n in range(1, 301):
            sent[n] = time.perf_counter()
            client.publish(
                Transition(
                    kind="xid",
                    uuid="GPU-0",
                    index=0,
                    previous="healthy",
                    current="healthy",
                    conditions=(),
                    at=AT,
                    xid=n,
                )
            )
            await asyncio.sleep(0.005)
        deadline = time.monotonic() + 10
        while len(arrivals) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        client.outbox.close()
    await runner.cleanup()
    lat = sorted((arrivals[n] - sent[n]) * 1000 for n in sent if n in arrivals)
    if len(lat) < 300:
        raise RuntimeError(f"only {len(lat)} of 300 events arrived")
    return {
        "stream_event_latency_ms_p50": lat[len(lat) // 2],
        "stream_event_latency_ms_p99": lat[int(len(lat) * 0.99) - 1],
    }


# -- 5,000 agents: two helper processes ---------------------------------------------------


def _raise_nofile() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class _NodeFromToken:
    """Fake authenticator for the load test: token ``tok-<node>`` is the agent on <node>."""

    def __init__(self, user: str) -> None:
        self._user = user

    async def review(self, token: str) -> object:
        from gpuhealth.controller.stream.auth import (
            NODE_NAME_KEY,
            POD_NAME_KEY,
            POD_UID_KEY,
            Identity,
        )

        node = token.removeprefix("tok-")
        return Identity(
            authenticated=True,
            username=self._user,
            audiences=("gpuhealth",),
            extra={
                NODE_NAME_KEY: (node,),
                POD_NAME_KEY: (f"agent-{node}",),
                POD_UID_KEY: (f"uid-{node}",),
            },
        )


def _serve(port: int) -> None:
    from aiohttp import web

    from gpuhealth.controller.stream.server import StreamServer
    from gpuhealth.controller.stream.settings import StreamServerSettings

    _raise_nofile()
    s = StreamServerSettings()
    user = f"system:serviceaccount:{s.agent_namespace}:{s.agent_service_account}"
    auth = _NodeFromToken(user)  # behind the server's review cache, as in production
    sink = _NullSink()
    server = StreamServer(s, auth, sink)  # type: ignore[arg-type]
    app = web.Application()
    server.add_routes(app)

    async def stats(_req: web.Request) -> web.Response:
        return web.json_response({"connections": len(server.connections), "messages": sink.count})

    app.router.add_get("/stats", stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


async def _clients(port: int, n: int, seconds: float) -> None:
    import aiohttp

    from gpuhealth.protocol import Hello, encode

    _raise_nofile()
    url = f"http://127.0.0.1:{port}/v1/stream"
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        sem = asyncio.Semaphore(100)
        sockets: list[aiohttp.ClientWebSocketResponse] = []

        async def connect(i: int) -> None:
            node = f"node-{i}"
            async with sem:
                ws = await http.ws_connect(
                    url, headers={"Authorization": f"Bearer tok-{node}"}, heartbeat=None
                )
                hello = Hello(seq=1, node=node, stream_id="s", boot_id="b", agent_version="v")
                await ws.send_bytes(encode(hello))
                await ws.receive()
                sockets.append(ws)

        await asyncio.gather(*(connect(i) for i in range(n)))
        print("ready", flush=True)

        async def beat(i: int, ws: aiohttp.ClientWebSocketResponse) -> None:
            await asyncio.sleep(random.uniform(0, HEARTBEAT_S))
            seq = 1
            while True:
                seq += 1
                await ws.send_bytes(_heartbeat(seq, f"node-{i}"))
                await asyncio.sleep(HEARTBEAT_S)

        async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
            async for _ in ws:  # acks
                pass

        tasks = [asyncio.create_task(beat(i, ws)) for i, ws in enumerate(sockets)]
        tasks += [asyncio.create_task(read(ws)) for ws in sockets]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()


async def _stats(port: int) -> dict[str, int]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/stats") as resp,
    ):
        data: dict[str, int] = await resp.json()
        return data


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _five_thousand() -> dict[str, float]:
    import socket

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < AGENTS + 256:
        raise RuntimeError(f"RLIMIT_NOFILE hard limit {hard} is below {AGENTS + 256}")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_stream", "serve", "--port", str(port)],
        env=env,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    clients: subprocess.Popen[str] | None = None
    try:
        await asyncio.sleep(1.5)
        clients = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.bench_stream",
                "clients",
                "--port",
                str(port),
                "--n",
                str(AGENTS),
                "--seconds",
                str(WINDOW_S + 60),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert clients.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(clients.stdout.readline), 90)
        if line.strip() != "ready":
            raise RuntimeError(f"clients did not connect: {line!r}")
        await asyncio.sleep(HEARTBEAT_S / 2)  # settle: the first heartbeats are spread out
        before = await _stats(port)
        cpu0, t0 = _proc_cpu_s(server.pid), time.monotonic()
        await asyncio.sleep(WINDOW_S)
        cpu1, t1 = _proc_cpu_s(server.pid), time.monotonic()
        rss = _proc_rss_mib(server.pid)
        after = await _stats(port)
        beats = after["messages"] - before["messages"]
        expected = AGENTS * WINDOW_S / HEARTBEAT_S
        print(
            f"bench: {after['connections']} agents connected, {beats} heartbeats in the window",
            file=sys.stderr,
        )
        if after["connections"] < AGENTS or beats < 0.9 * expected:
            raise RuntimeError(f"load not as specified: {after}, {beats} heartbeats")
    finally:
        for p in (clients, server):
            if p is not None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return {
        "controller_cpu_percent_5000_agents": 100 * (cpu1 - cpu0) / (t1 - t0),
        "controller_rss_mib_5000_agents": rss,
    }


BENCHMARKS = [
    Benchmark(
        name="stream_ingest",
        targets=(Target("controller_ingest_msgs_per_s", "msg/s", 20_000, ">="),),
        run=_ingest,
        repeats=1,
    ),
    Benchmark(
        name="stream_latency",
        targets=(
            Target("stream_event_latency_ms_p50", "ms", 10, "<="),
            Target("stream_event_latency_ms_p99", "ms", 10, "<="),
        ),
        run=_latency,
    ),
    Benchmark(
        name="stream_5000_agents",
        targets=(
            Target("controller_cpu_percent_5000_agents", "%", 10, "<="),
            Target("controller_rss_mib_5000_agents", "MiB", 300, "<="),
        ),
        run=_five_thousand,
        repeats=3,
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "clients"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=AGENTS)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    if args.mode == "serve":
        _serve(args.port)
    else:
        asyncio.run(_clients(args.port, args.n, args.seconds))


if __name__ == "__main__":
    main()
