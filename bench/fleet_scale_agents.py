"""The agents of ``bench_fleet_scale``: one worker process drives many WebSocket agents.

``python -m bench.fleet_scale_agents --url ws://HOST:PORT/v1/stream --tokens FILE [--heartbeat
real|fixed] [--heartbeat-s 10] [--poll-s 1] [--reconnect]``: one agent per line ``<number>
<node> <bound token>`` of FILE. Past one process (``bench_fleet_shards``), instead of
``--url``: ``--shards S --kubeconfig K --namespace NS --service SVC --pod IP=HOST ...``: each
agent connects to its shard's owner (``shard_of(node, S)``, then the shard a 503 names in
``Gpuhealth-Shard``), at the address that shard's Service's EndpointSlice names when the
connection is made (the process follows the slices as kube-proxy does on each node:
:class:`tests.integration.leader_route.ShardEndpoints`; ``--pod`` maps each replica's pod IP
to the loopback address it listens on); no endpoint is a refused connection (back-off).
``--reconnect``: an agent whose stream ends connects again by itself, after the agent's
back-off (as the real agent does when its controller goes away).

Each agent has its own source address (``127.<a>.<b>.<c>`` from its number, as every node has
its own address: the controller limits what one address may hold open) and
speaks the real protocol as the agent does. When the controller paces admission (HTTP 503 with
``Retry-After`` before the upgrade, or ``Error(rate-limited, retry_after_s)`` after Hello) the
agent comes back after that delay plus up to half of it again (the agent's
``retry_after_jitter``); a connection that fails is retried after the agent's back-off (0.5 s
doubling to 30 s, +/- 30 %).

What they send (``--heartbeat``, switched at run time by ``shape``):

- ``real`` (the default): what the real ``gpuhealth-agent`` sends with the simulated GPU source
  on a busy node, every GPU held by one pod (:func:`busy_pod`). Measured with
  ``python -m bench.stream_recording`` (the real agent process, 8 simulated H100s, a kubelet
  PodResources server, the agent's defaults: a Heartbeat every 10 s, a poll a second; 180 s on
  2026-12-02): on its first connection Hello (1,680 bytes), 8 Events (178 bytes each: every
  GPU unknown -> healthy at its first poll), a Snapshot (3,861 bytes) and 10 ms later another
  with the pod's allocations (5,253 bytes: the kubelet's first answer came after the first);
  then nothing but Heartbeats, 3,336 bytes each, every 10.00 s, each with 8 telemetry and 8
  usage entries. Between consecutive Heartbeats ``at`` changed in 100 % of the pairs, each
  GPU's power in 100 %, utilisation in 98 %, memory bandwidth in 98 %, temperature in 94 %, each
  usage figure in 98 % (its ``samples``, 9-11 polls, in 19 %); the temperature and shutdown
  limits, ``sbe_recent``, ``throttled`` and the attribution never. Ranges: 50.0-65.9 °C,
  373-636 W, utilisation 0.53-0.98, memory bandwidth 0.32-0.59. On a later connection (a
  controller restart or failover: its outbox acknowledged) the agent sends Hello and one
  Snapshot, then Heartbeats. The simulated agents send the same: the simulated source's GPU
  identities (:class:`NodeGpus`), the start-up Events on their first connection only, one
  Snapshot with the allocations, Heartbeats of the current time, telemetry drifting per GPU
  (the source's model: utilisation around each GPU's level, temperature and power following
  it, its noise and rounding) and the pod's usage of every GPU; byte for byte the real sizes.
  ``tests/integration/test_bench_stream_shape.py`` holds them to a recording of the real agent
  (:func:`bench.stream_profile.differences`). Building and encoding one Heartbeat costs about
  15 us.
- ``fixed``: what this benchmark's agents sent before issue 43: the same telemetry objects
  every time (nothing changes from one Heartbeat to the next), a fixed ``at``, no usage, no
  allocations in the Snapshot, no start-up Events (1,940-byte Heartbeats).

Commands on stdin, one a line; answers on stdout:

- ``go``: every agent connects at once (as after a failover); prints ``connected <count>
  <monotonic time the last was acknowledged> <attempts> <come-backs> <failures>``; again after
  their controller went away (a successor took over): each agent a new connection, a new Hello
  and Snapshot on the same stream, counted afresh;
- ``shape real|fixed``: from now on every agent sends that; each connected one sends a Snapshot
  first (its pod came or went, as the real agent does when its allocations change); prints
  ``shaped <count> <monotonic time>``;
- ``fault <number>``: that agent sends an Event: GPU 0 unhealthy with XID 79; prints ``sent
  <number> <monotonic time>`` (``time.monotonic`` is the system's CLOCK_MONOTONIC, the same
  in every process);
- ``lost``: prints ``lost <count>``, agents whose stream ended after it was acknowledged;
- ``shards``: per shard, how its agents stand: prints ``shards <monotonic time>`` then, for
  each shard with agents here, ``<shard>:<agents>:<connected now>:<streams lost>:<latest
  acknowledged connection, monotonic>``. A ``fault`` is remembered: that agent's later
  Snapshots (after a reconnect) report GPU 0 unhealthy with it, as the real agent's would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import random
import resource
import secrets
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import aiohttp

from gpuhealth.agent import __version__ as AGENT_VERSION
from gpuhealth.agent.health.conditions import gpu_info
from gpuhealth.agent.sources.sim.scenario import Scenario
from gpuhealth.agent.sources.sim.source import (
    H100_POWER_LIMIT_W,
    H100_SHUTDOWN_C,
    H100_SLOWDOWN_C,
    SimSource,
)
from gpuhealth.common.clock import SystemClock
from gpuhealth.protocol import (
    NODE_HEADER,
    Ack,
    Allocation,
    AllocationUsage,
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
from gpuhealth.protocol.shards import SHARD_HEADER, shard_of

GPUS = 8
HEARTBEAT_S = 10.0
"""The agent's default heartbeat interval (``stream.heartbeat_interval_s``)."""
POLL_S = 1.0
"""The agent's default GPU poll interval (``nvml.poll_interval_s``, the simulator's too): a
Heartbeat's usage averages the polls since the previous one."""
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
Shape = Literal["fixed", "real"]
SHAPES: tuple[Shape, ...] = get_args(Shape)
UTIL_LEVELS = (0.55, 0.95)
"""Each GPU's utilisation level, as the simulated GPU source draws it; the figures below are
that source's model of an H100 at that level (``agent/sources/sim/source.py``)."""
UTIL_SD, TEMPERATURE_SD, POWER_SD = 0.02, 0.5, 8.0
"""The poll-to-poll noise of utilisation (ratio), temperature (°C) and power (W): the
simulator's standard deviations, drawn here as uniform noise of the same spread (cheaper)."""
_UNIFORM = 12**0.5
"""A uniform draw of width ``sd * _UNIFORM`` has standard deviation ``sd``."""
_CLOCK = SystemClock()
BUSY_NAMESPACE = "ml-training"


def busy_pod(node: str) -> tuple[str, str, str]:
    """(namespace, pod, container) of the pod holding every GPU of ``node`` in a busy fleet
    (one 8-GPU worker of a training job per node)."""
    return BUSY_NAMESPACE, f"llm-pretrain-worker-{node.rsplit('-', 1)[-1]}", "pytorch"


def source_address(number: int) -> str:
    """Agent ``number``'s own loopback address (127.1.0.1 upwards, never .0 or .255)."""
    a, rest = divmod(number, 254 * 254)
    b, c = divmod(rest, 254)
    return f"127.{1 + a}.{1 + b}.{1 + c}"


class NodeGpus:
    """What one simulated node's agent reports, built once per agent so that each Heartbeat
    costs a few random draws and one msgspec encode: its GPUs (the simulated GPU source's
    identities for seed ``number``: UUIDs, PCI addresses, serials), each GPU's utilisation
    level, the busy pod's allocation of every GPU, and the fixed telemetry of ``fixed``."""

    __slots__ = ("allocations", "fixed", "infos", "levels", "samples")

    def __init__(self, number: int, node: str, samples: int = int(HEARTBEAT_S / POLL_S)) -> None:
        inventory = SimSource(Scenario(gpus=GPUS), _CLOCK, number).inventory()
        self.infos: list[GpuInfo] = [gpu_info(g) for g in inventory.gpus]
        rng = random.Random(number)
        self.levels = [rng.uniform(*UTIL_LEVELS) for _ in self.infos]
        self.samples = max(1, samples)
        """Polls per Heartbeat (each usage figure is their mean)."""
        namespace, pod, container = busy_pod(node)
        self.allocations = [
            Allocation(
                namespace=namespace,
                pod=pod,
                container=container,
                gpu_uuid=i.uuid,
                device_id=i.uuid,
            )
            for i in self.infos
        ]
        self.fixed = [
            GpuTelemetry(
                uuid=info.uuid,
                temperature_c=40.0 + i,
                slowdown_temperature_c=87.0,
                shutdown_temperature_c=92.0,
                power_w=350.0,
                utilization_ratio=0.5,
                memory_bandwidth_ratio=0.3,
                sbe_recent=0,
            )
            for i, info in enumerate(self.infos)
        ]

    def telemetry(self, rnd: Callable[[], float] = random.random) -> list[GpuTelemetry]:
        """Every GPU's latest poll, drifting: utilisation around its level, temperature and
        power following it, each with the simulator's noise, rounded as the source rounds
        (``round(x * 10) / 10`` is ``round(x, 1)`` at a third of its cost)."""
        u_noise, t_noise, p_noise = (sd * _UNIFORM for sd in (UTIL_SD, TEMPERATURE_SD, POWER_SD))
        out = []
        for info, level in zip(self.infos, self.levels, strict=True):
            u = level + (rnd() - 0.5) * u_noise
            u = 0.0 if u < 0.0 else 1.0 if u > 1.0 else u
            temperature = 34.0 + 32.0 * u + (rnd() - 0.5) * t_noise
            power = min(75.0 + 560.0 * u + (rnd() - 0.5) * p_noise, H100_POWER_LIMIT_W)
            out.append(
                GpuTelemetry(
                    uuid=info.uuid,
                    temperature_c=round(temperature * 10) / 10,
                    slowdown_temperature_c=H100_SLOWDOWN_C,
                    shutdown_temperature_c=H100_SHUTDOWN_C,
                    power_w=round(power * 10) / 10,
                    utilization_ratio=round(u * 1000) / 1000,
                    memory_bandwidth_ratio=round(u * 600) / 1000,
                    sbe_recent=0,
                )
            )
        return out

    def usage(self, rnd: Callable[[], float] = random.random) -> list[AllocationUsage]:
        """The busy pod's use of every GPU since the previous Heartbeat: the mean of
        :attr:`samples` polls (per GPU: the simulator's GPUs list no processes)."""
        spread = UTIL_SD * _UNIFORM / self.samples**0.5
        out = []
        for a, level in zip(self.allocations, self.levels, strict=True):
            u = level + (rnd() - 0.5) * spread
            out.append(
                AllocationUsage(
                    namespace=a.namespace,
                    pod=a.pod,
                    container=a.container,
                    gpu_uuid=a.gpu_uuid,
                    utilization_ratio=0.0 if u < 0.0 else 1.0 if u > 1.0 else u,
                    samples=self.samples,
                    attribution="gpu",
                )
            )
        return out

    def heartbeat(self, shape: Shape, seq: int, node: str) -> Heartbeat:
        if shape == "fixed":
            return Heartbeat(seq=seq, node=node, at=AT, telemetry=self.fixed)
        return Heartbeat(
            seq=seq, node=node, at=datetime.now(UTC), usage=self.usage(), telemetry=self.telemetry()
        )

    def snapshot(self, shape: Shape, seq: int, node: str, faulty: bool = False) -> Snapshot:
        """Every GPU healthy with its telemetry (``faulty``: GPU 0 unhealthy with XID 79); in
        ``real``, the busy pod's allocations."""
        telemetry = self.fixed if shape == "fixed" else self.telemetry()
        gpus = [
            GpuStatus(info=i, state="healthy", telemetry=t)
            if not (faulty and k == 0)
            else GpuStatus(info=i, state="unhealthy", telemetry=t, conditions=[XID79])
            for k, (i, t) in enumerate(zip(self.infos, telemetry, strict=True))
        ]
        if shape == "fixed":
            return Snapshot(seq=seq, node=node, taken_at=AT, gpus=gpus)
        return Snapshot(
            seq=seq, node=node, taken_at=datetime.now(UTC), gpus=gpus, allocations=self.allocations
        )

    def started(self, first_seq: int, node: str) -> list[Event]:
        """The Events of an agent's start: every GPU from unknown to healthy at its first
        poll, in the outbox before the first connection."""
        at = datetime.now(UTC)
        return [
            Event(
                seq=first_seq + k,
                node=node,
                at=at,
                kind="transition",
                gpu_uuid=i.uuid,
                gpu_index=i.index,
                previous="unknown",
                current="healthy",
            )
            for k, i in enumerate(self.infos)
        ]


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
    """The last sequence number sent on the stream (Events, Snapshots, Heartbeats)."""
    gpus: NodeGpus | None = None
    stream_id: str = field(default_factory=lambda: secrets.token_hex(16))
    """As the agent's state directory names its outbox."""
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started: bool = False
    """Its start-up Events were acknowledged (only its first connection carries them)."""
    shard: int = 0
    """The shard whose owner it connects to."""
    faulty: bool = False
    """It sent the XID 79 of ``fault``: its Snapshots say so from then on."""
    live: bool = False
    """Its stream is acknowledged and open now."""
    losses: int = 0
    """Its acknowledged streams that ended."""
    back_at: float = 0.0
    """Monotonic time its latest stream was acknowledged."""


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


async def _acked(
    ws: aiohttp.ClientWebSocketResponse, frames: Sequence[bytes], seq: int | None
) -> None:
    """Send ``frames``, read Acks until one covers ``seq`` (None: the first, as the Hello's
    says how much of this stream the controller applied already)."""
    for frame in frames:
        await ws.send_bytes(frame)
    while True:
        msg = await ws.receive(timeout=ACK_TIMEOUT_S)
        if msg.type is not aiohttp.WSMsgType.BINARY:
            raise ConnectionError(f"stream ended before Ack {seq}: {msg.type}")
        reply = decode_controller(msg.data)
        if isinstance(reply, Error) and reply.retry_after_s is not None:
            raise _ComeBack(reply.retry_after_s)
        if not isinstance(reply, Ack):
            raise ConnectionError(f"expected Ack {seq}, got {reply!r}")
        if seq is None or reply.seq >= seq:
            return


async def _upgrade(
    http: aiohttp.ClientSession, url: str, a: _Agent
) -> aiohttp.ClientWebSocketResponse:
    """The WebSocket upgrade; HTTP 503 with ``Retry-After`` is the controller turning the
    agent away before it (come back then), as the agent's client reads it; with
    ``Gpuhealth-Shard`` it names the shard that owns the node: the agent's from then on."""
    headers = {"Authorization": f"Bearer {a.token}", NODE_HEADER: a.node}
    try:
        return await http.ws_connect(url, headers=headers, heartbeat=None)
    except aiohttp.WSServerHandshakeError as exc:
        retry = retry_after_from_header(exc.headers.get("Retry-After") if exc.headers else None)
        owner = exc.headers.get(SHARD_HEADER, "") if exc.headers else ""
        if exc.status == 503 and owner.isdigit():
            a.shard = int(owner)
        if exc.status == 503 and retry is not None:
            raise _ComeBack(retry) from exc
        raise


def _hello(a: _Agent, gpus: NodeGpus, seq: int) -> Hello:
    """The agent's Hello (``seq``: its first message not acknowledged yet); remediation is off
    by default, so it names no capabilities."""
    return Hello(
        seq=seq,
        node=a.node,
        stream_id=a.stream_id,
        boot_id=a.boot_id,
        agent_version=AGENT_VERSION,
        gpus=gpus.infos,
        capabilities=[],
    )


@dataclass
class _Fleet:
    """One process's agents and how they speak now."""

    url: str
    agents: Sequence[_Agent]
    shape: Shape
    heartbeat_s: float = HEARTBEAT_S
    samples: int = int(HEARTBEAT_S / POLL_S)
    counts: _Counts = field(default_factory=_Counts)
    endpoints: Any = None
    """Past one process: the shards' endpoints followed
    (:class:`tests.integration.leader_route.ShardEndpoints`); None: every agent uses ``url``."""
    reconnect: bool = False
    """An agent whose stream ends connects again by itself."""

    def url_of(self, a: _Agent) -> str:
        """Where ``a`` connects now: ``url``, or its shard's owner's address (refused while
        its Service has no endpoint)."""
        if self.endpoints is None:
            return self.url
        address = self.endpoints.address(a.shard)
        if address is None:
            raise ConnectionRefusedError(f"shard {a.shard}'s Service has no endpoint")
        return f"ws://{address[0]}:{address[1]}/v1/stream"

    def gpus(self, a: _Agent) -> NodeGpus:
        if a.gpus is None:
            a.gpus = NodeGpus(a.number, a.node, self.samples)
        return a.gpus


async def _stream(fleet: _Fleet, a: _Agent) -> None:
    connector = aiohttp.TCPConnector(limit=0, local_addr=(source_address(a.number), 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        await _connected(fleet, a, http)
        while fleet.reconnect:
            # the agent's back-off after a lost stream (its first step), then a new stream
            await asyncio.sleep(0.5 * random.uniform(0.7, 1.3))
            await _connected(fleet, a, http)


async def _connected(fleet: _Fleet, a: _Agent, http: aiohttp.ClientSession) -> None:
    """Hello, the start-up Events of a real agent's first connection, a Snapshot; acknowledged,
    then Heartbeats until the stream ends."""
    counts = fleet.counts
    gpus = fleet.gpus(a)
    attempt = 0
    first = a.seq + 1
    events = [] if a.started or fleet.shape == "fixed" else gpus.started(first, a.node)
    snapshot_seq = first + len(events)
    a.seq = snapshot_seq
    frames = [encode(e) for e in events]
    frames.append(encode(gpus.snapshot(fleet.shape, snapshot_seq, a.node, a.faulty)))
    hello = encode(_hello(a, gpus, first))
    while True:
        counts.attempts += 1
        ws = None
        try:
            ws = await _upgrade(http, fleet.url_of(a), a)
            await _acked(ws, [hello], None)
            await _acked(ws, frames, snapshot_seq)
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
    a.ws, a.started, a.live = ws, True, True
    counts.connected += 1
    counts.last_at = a.back_at = time.monotonic()
    if counts.connected == len(fleet.agents):
        print(
            f"connected {counts.connected} {counts.last_at:.6f} {counts.attempts} "
            f"{counts.come_backs} {counts.failures}",
            flush=True,
        )
    beat = asyncio.create_task(_heartbeats(fleet, a, ws))
    try:
        async for _ in ws:  # acks
            pass
    finally:
        beat.cancel()
        counts.lost += 1
        a.live = False
        a.losses += 1


async def _heartbeats(fleet: _Fleet, a: _Agent, ws: aiohttp.ClientWebSocketResponse) -> None:
    await asyncio.sleep(random.uniform(0, fleet.heartbeat_s))
    gpus = fleet.gpus(a)
    while not ws.closed:
        a.seq += 1
        await ws.send_bytes(encode(gpus.heartbeat(fleet.shape, a.seq, a.node)))
        await asyncio.sleep(fleet.heartbeat_s)


async def _reshape(fleet: _Fleet, shape: Shape) -> int:
    """Every agent speaks ``shape`` from now on; each connected one sends a Snapshot first (its
    pod came or went, as the real agent does when its allocations change). Returns how many
    sent one."""
    fleet.shape = shape
    sent = 0
    for a in fleet.agents:
        if a.ws is not None and not a.ws.closed and a.gpus is not None:
            a.seq += 1
            await a.ws.send_bytes(encode(a.gpus.snapshot(shape, a.seq, a.node, a.faulty)))
            sent += 1
    return sent


async def _fault(fleet: _Fleet, a: _Agent) -> None:
    assert a.ws is not None
    a.seq += 1
    event = Event(
        seq=a.seq,
        node=a.node,
        at=datetime.now(UTC),
        kind="transition",
        gpu_uuid=fleet.gpus(a).infos[0].uuid,
        gpu_index=0,
        previous="healthy",
        current="unhealthy",
        conditions=[XID79],
        xid=79,
    )
    frame = encode(event)
    a.faulty = True
    sent = time.monotonic()
    await a.ws.send_bytes(frame)
    print(f"sent {a.number} {sent:.6f}", flush=True)


async def _run(fleet: _Fleet) -> None:
    tasks: set[asyncio.Task[None]] = set()

    async def progress() -> None:
        counts = fleet.counts
        while counts.connected < len(fleet.agents):
            await asyncio.sleep(10.0)
            print(f"progress: {counts.line()}", file=sys.stderr, flush=True)

    by_number = {a.number: a for a in fleet.agents}
    stdin = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        words = line.decode().split()
        if words == ["go"]:
            fleet.counts = _Counts()
            tasks.add(asyncio.create_task(progress()))
            for a in fleet.agents:
                t = asyncio.create_task(_stream(fleet, a))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        elif words[:1] == ["fault"]:
            await _fault(fleet, by_number[int(words[1])])
        elif words[:1] == ["shape"] and (shape := _shape(words[1:])) is not None:
            sent = await _reshape(fleet, shape)
            print(f"shaped {sent} {time.monotonic():.6f}", flush=True)
        elif words == ["lost"]:
            print(f"lost {fleet.counts.lost}", flush=True)
        elif words == ["shards"]:
            print(f"shards {time.monotonic():.6f} {_by_shard(fleet.agents)}", flush=True)


def _by_shard(agents: Sequence[_Agent]) -> str:
    """``<shard>:<agents>:<connected now>:<streams lost>:<latest connection>`` per shard."""
    out = []
    for shard in sorted({a.shard for a in agents}):
        mine = [a for a in agents if a.shard == shard]
        live = sum(a.live for a in mine)
        lost = sum(a.losses for a in mine)
        out.append(f"{shard}:{len(mine)}:{live}:{lost}:{max(a.back_at for a in mine):.6f}")
    return " ".join(out)


def _shape(words: Sequence[str]) -> Shape | None:
    return next((s for s in SHAPES if [s] == list(words)), None)


def _read_tokens(path: str) -> list[_Agent]:
    agents = []
    with open(path) as f:
        for line in f:
            number, node, token = line.split()
            agents.append(_Agent(int(number), node, token))
    return agents


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_scale_agents", description=__doc__)
    ap.add_argument("--url", default="", help="ws://HOST:PORT/v1/stream")
    ap.add_argument("--tokens", required=True, help="file of '<number> <node> <token>' lines")
    ap.add_argument("--heartbeat", choices=SHAPES, default="real", help="what agents send")
    ap.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S, help="heartbeat interval")
    ap.add_argument("--poll-s", type=float, default=POLL_S, help="polls per heartbeat: interval")
    ap.add_argument("--reconnect", action="store_true", help="a stream that ends reconnects")
    ap.add_argument("--shards", type=int, default=0, help="S: connect to each shard's owner")
    ap.add_argument("--kubeconfig", default="", help="reads the shards' EndpointSlices")
    ap.add_argument("--namespace", default="", help="the controller's namespace")
    ap.add_argument("--service", default="", help="the controller's leader.service")
    ap.add_argument("--pod", action="append", default=[], help="IP=HOST: a replica's address")
    args = ap.parse_args(argv)
    if not args.url and not args.shards:
        ap.error("--url or --shards is required")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    agents = _read_tokens(args.tokens)
    for a in agents:
        a.shard = shard_of(a.node, args.shards) if args.shards else 0
    fleet = _Fleet(
        url=args.url,
        agents=agents,
        shape=args.heartbeat,
        heartbeat_s=args.heartbeat_s,
        samples=round(args.heartbeat_s / args.poll_s),
        reconnect=args.reconnect,
    )
    if not args.shards:
        asyncio.run(_run(fleet))
        return
    pods = dict(p.split("=", 1) for p in args.pod)
    asyncio.run(
        _run_sharded(fleet, args.kubeconfig, args.namespace, args.service, pods, args.shards)
    )


async def _run_sharded(
    fleet: _Fleet, kubeconfig: str, namespace: str, service: str, pods: dict[str, str], shards: int
) -> None:
    """:func:`_run`, each agent's address from its shard's EndpointSlice, followed here."""
    from gpuhealth.controller.kube.client import make_api_client

    route: Any = importlib.import_module("tests.integration.leader_route")
    api = await make_api_client(kubeconfig)
    try:
        endpoints = route.ShardEndpoints(api, namespace, service, pods, shards, poll_s=0.2)
        async with contextlib.AsyncExitStack() as stack:
            fleet.endpoints = await stack.enter_async_context(endpoints.following())
            await _run(fleet)
    finally:
        await api.close()


if __name__ == "__main__":
    main()
