"""The agents of ``bench_fleet_scale``: one worker process drives many WebSocket agents.

``python -m bench.fleet_scale_agents --url ws://HOST:PORT/v1/stream --tokens FILE``: one agent
per line ``<number> <node> <bound token>`` of FILE. Each agent has its own source address
(``127.<a>.<b>.<c>`` from its number, as every node has its own address: the controller
limits what one address may hold open) and speaks the real protocol as the agent does: Hello,
Snapshot of 8 healthy GPUs with telemetry, both acknowledged, then a Heartbeat (telemetry of
every GPU) every ``HEARTBEAT_S`` at a random phase, reading acks. When the
controller paces admission (HTTP 503 with ``Retry-After`` before the upgrade, or
``Error(rate-limited, retry_after_s)`` after Hello) the agent comes back after that delay plus
up to half of it again (the agent's ``retry_after_jitter``); a connection that
fails is retried after the agent's back-off (0.5 s doubling to 30 s, +/- 30 %).

Commands on stdin, one a line; answers on stdout:

- ``go``: every agent connects at once (as after a failover); prints ``connected <count>
  <monotonic time the last was acknowledged> <attempts> <come-backs> <failures>``; again after
  their controller went away (a successor took over): each agent a new connection, a new Hello
  and Snapshot on the same stream, counted afresh;
- ``fault <number>``: that agent sends an Event: GPU 0 unhealthy with XID 79; prints ``sent
  <number> <monotonic time>`` (``time.monotonic`` is the system's CLOCK_MONOTONIC, the same
  in every process);
- ``lost``: prints ``lost <count>``, agents whose stream ended after it was acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from gpuhealth.protocol import (
    NODE_HEADER,
    Ack,
    Condition,
    Error,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Heartbeat,
    Hello,
    Snapshot,
    encode,
    retry_after_from_header,
)
from gpuhealth.protocol.codec import decode_controller

GPUS = 8
HEARTBEAT_S = 10.0
"""The agent's default heartbeat interval."""
ACK_TIMEOUT_S = 60.0
"""How long an agent waits for an acknowledgement (the agent's ``accept_timeout_s``)."""
AT = datetime(2026, 11, 22, 10, tzinfo=UTC)
XID79 = Condition(
    reason="XidError",
    code="xid-79",
    severity="unhealthy",
    message="GPU has fallen off the bus",
    action="RESTART_BM",
    xid=79,
)


def source_address(number: int) -> str:
    """Agent ``number``'s own loopback address (127.1.0.1 upwards, never .0 or .255)."""
    a, rest = divmod(number, 254 * 254)
    b, c = divmod(rest, 254)
    return f"127.{1 + a}.{1 + b}.{1 + c}"


def _gpus(node: str) -> list[GpuStatus]:
    return [
        GpuStatus(
            info=GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H100 80GB HBM3"),
            state="healthy",
            telemetry=_telemetry(node, i),
        )
        for i in range(GPUS)
    ]


def _telemetry(node: str, i: int) -> GpuTelemetry:
    return GpuTelemetry(
        uuid=f"GPU-{node}-{i}",
        temperature_c=40.0 + i,
        slowdown_temperature_c=87.0,
        shutdown_temperature_c=92.0,
        power_w=350.0,
        utilization_ratio=0.5,
        memory_bandwidth_ratio=0.3,
        sbe_recent=0,
    )


class _ComeBack(Exception):
    def __init__(self, after_s: float) -> None:
        super().__init__(after_s)
        self.after_s = after_s


@dataclass
class _Agent:
    number: int
    node: str
    token: str
    ws: aiohttp.ClientWebSocketResponse | None = None
    seq: int = 0
    """The last sequence number sent on the stream (Hello, Snapshot, Heartbeats, Events)."""
    gpus: list[GpuStatus] = field(default_factory=list)


@dataclass
class _Counts:
    attempts: int = 0
    come_backs: int = 0
    failures: int = 0
    connected: int = 0
    lost: int = 0
    last_at: float = 0.0
    told: list[float] = field(default_factory=list)
    """Every ``retry_after_s`` the controller told."""
    away: int = 0
    """Agents now waiting to come back (told, or backing off after a failure)."""

    def line(self) -> str:
        told = sorted(self.told) or [0.0]
        return (
            f"connected {self.connected}, attempts {self.attempts}, come-backs "
            f"{self.come_backs} (told median {told[len(told) // 2]:.1f} s, max {told[-1]:.1f}"
            f" s), failures {self.failures}, away now {self.away}"
        )


async def _acked(ws: aiohttp.ClientWebSocketResponse, frame: bytes, seq: int | None) -> None:
    """Send ``frame``, wait for its Ack (``seq``; None: any, as the Hello's says how much of
    this stream the controller applied already)."""
    await ws.send_bytes(frame)
    msg = await ws.receive(timeout=ACK_TIMEOUT_S)
    if msg.type is not aiohttp.WSMsgType.BINARY:
        raise ConnectionError(f"stream ended before Ack {seq}: {msg.type}")
    reply = decode_controller(msg.data)
    if isinstance(reply, Error) and reply.retry_after_s is not None:
        raise _ComeBack(reply.retry_after_s)
    if not isinstance(reply, Ack) or (seq is not None and reply.seq != seq):
        raise ConnectionError(f"expected Ack {seq}, got {reply!r}")


async def _upgrade(
    http: aiohttp.ClientSession, url: str, a: _Agent
) -> aiohttp.ClientWebSocketResponse:
    """The WebSocket upgrade; HTTP 503 with ``Retry-After`` is the controller turning the
    agent away before it (come back then), as the agent's client reads it."""
    headers = {"Authorization": f"Bearer {a.token}", NODE_HEADER: a.node}
    try:
        return await http.ws_connect(url, headers=headers, heartbeat=None)
    except aiohttp.WSServerHandshakeError as exc:
        retry = retry_after_from_header(exc.headers.get("Retry-After") if exc.headers else None)
        if exc.status == 503 and retry is not None:
            raise _ComeBack(retry) from exc
        raise


async def _run(url: str, agents: Sequence[_Agent]) -> None:
    counts = _Counts()
    tasks: set[asyncio.Task[None]] = set()

    async def stream(a: _Agent) -> None:
        connector = aiohttp.TCPConnector(limit=0, local_addr=(source_address(a.number), 0))
        async with aiohttp.ClientSession(connector=connector) as http:
            await connected(a, http)

    async def connected(a: _Agent, http: aiohttp.ClientSession) -> None:
        attempt = 0
        a.gpus = _gpus(a.node)
        hello_seq, snapshot_seq = a.seq + 1, a.seq + 2
        a.seq = snapshot_seq
        hello = encode(
            Hello(
                seq=hello_seq,
                node=a.node,
                stream_id=f"s{a.number}",
                boot_id="b",
                agent_version="bench",
                gpus=[g.info for g in a.gpus],
                expected_gpus=GPUS,
                capabilities=[],
            )
        )
        snapshot = encode(Snapshot(seq=snapshot_seq, node=a.node, taken_at=AT, gpus=a.gpus))
        while True:
            counts.attempts += 1
            ws = None
            try:
                ws = await _upgrade(http, url, a)
                await _acked(ws, hello, None)
                await _acked(ws, snapshot, snapshot_seq)
                break
            except _ComeBack as later:
                counts.come_backs += 1
                counts.told.append(later.after_s)
                delay = later.after_s * random.uniform(1.0, 1.5)
            except (aiohttp.ClientError, OSError, ConnectionError, TimeoutError) as exc:
                counts.failures += 1
                print(f"failure: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                attempt += 1
                delay = min(30.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.7, 1.3)
            if ws is not None:
                await ws.close()
            counts.away += 1
            await asyncio.sleep(delay)
            counts.away -= 1
        a.ws = ws
        counts.connected += 1
        counts.last_at = time.monotonic()
        if counts.connected == len(agents):
            print(
                f"connected {counts.connected} {counts.last_at:.6f} {counts.attempts} "
                f"{counts.come_backs} {counts.failures}",
                flush=True,
            )
        beat = asyncio.create_task(heartbeats(a, ws))
        try:
            async for _ in ws:  # acks
                pass
        finally:
            beat.cancel()
            counts.lost += 1

    async def heartbeats(a: _Agent, ws: aiohttp.ClientWebSocketResponse) -> None:
        await asyncio.sleep(random.uniform(0, HEARTBEAT_S))
        telemetry = [g.telemetry for g in a.gpus if g.telemetry is not None]
        while not ws.closed:
            a.seq += 1
            beat = Heartbeat(seq=a.seq, node=a.node, at=AT, telemetry=telemetry)
            await ws.send_bytes(encode(beat))
            await asyncio.sleep(HEARTBEAT_S)

    async def fault(a: _Agent) -> None:
        assert a.ws is not None
        a.seq += 1
        event = Event(
            seq=a.seq,
            node=a.node,
            at=datetime.now(UTC),
            kind="transition",
            gpu_uuid=f"GPU-{a.node}-0",
            gpu_index=0,
            previous="healthy",
            current="unhealthy",
            conditions=[XID79],
            xid=79,
        )
        frame = encode(event)
        sent = time.monotonic()
        await a.ws.send_bytes(frame)
        print(f"sent {a.number} {sent:.6f}", flush=True)

    async def progress() -> None:
        while counts.connected < len(agents):
            await asyncio.sleep(10.0)
            print(f"progress: {counts.line()}", file=sys.stderr, flush=True)

    by_number = {a.number: a for a in agents}
    stdin = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        words = line.decode().split()
        if words == ["go"]:
            counts = _Counts()
            tasks.add(asyncio.create_task(progress()))
            for a in agents:
                t = asyncio.create_task(stream(a))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        elif words[:1] == ["fault"]:
            await fault(by_number[int(words[1])])
        elif words == ["lost"]:
            print(f"lost {counts.lost}", flush=True)


def _read_tokens(path: str) -> list[_Agent]:
    agents = []
    with open(path) as f:
        for line in f:
            number, node, token = line.split()
            agents.append(_Agent(int(number), node, token))
    return agents


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_scale_agents", description=__doc__)
    ap.add_argument("--url", required=True, help="ws://HOST:PORT/v1/stream")
    ap.add_argument("--tokens", required=True, help="file of '<number> <node> <token>' lines")
    args = ap.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(_run(args.url, _read_tokens(args.tokens)))


if __name__ == "__main__":
    main()
