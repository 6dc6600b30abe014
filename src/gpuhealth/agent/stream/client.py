"""The agent's WebSocket client: Hello, replay of the outbox, a fresh Snapshot, live messages.

Every message the agent sends (except Hello) goes through the :class:`Outbox` first, which
assigns its sequence number and keeps it until the controller acknowledges it. On each
(re)connect the client sends Hello (``seq`` = the lowest unacknowledged sequence number),
appends a fresh Snapshot to the outbox (it supersedes any older unsent one) and then sends
every pending message in sequence order: the replayed backlog first, then the Snapshot, then
live Events and Heartbeats. The controller applies each sequence number at most once.

After Hello the client sends nothing until the controller answers (``accept_timeout_s``): its
first Ack (accepted: the Ack deadline starts only now, when the controller serves this agent)
or an Error. ``Error(rate-limited, retry_after_s=N)`` is the controller pacing admissions after
a restart or failover: the client comes back after N s plus jitter, without growing its
backoff; so is HTTP 503 with ``Retry-After: N`` in answer to the upgrade itself (the request
names the node in ``Gpuhealth-Node``, so the controller knows whose agent it turned away). A
controller older than this sends its Ack at once, so nothing changes with it.

Past one process the client dials its shard's URL (:class:`ShardRoute`); a 503 that names
another shard in ``Gpuhealth-Shard`` moves it there, after the same ``Retry-After``.

The controller may also send remediation orders on the same connection; they go to the
:class:`OrderReceiver`, whose action reports come back through the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.stream.outbox import Outbox, OutboxMessage
from gpuhealth.agent.stream.settings import StreamClientSettings
from gpuhealth.agent.stream.shard_route import ShardRoute
from gpuhealth.common.backoff import Backoff, stretched
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor
from gpuhealth.protocol import (
    MAX_FRAME_BYTES,
    NODE_HEADER,
    Ack,
    Allocation,
    AllocationUsage,
    Condition,
    Error,
    ErrorCode,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Heartbeat,
    Hello,
    NicPortInfo,
    ProtocolError,
    Snapshot,
    encode,
    retry_after_from_header,
)
from gpuhealth.protocol.codec import ControllerFrame, decode_controller
from gpuhealth.protocol.remediation import Order
from gpuhealth.protocol.shards import SHARD_HEADER
from gpuhealth.protocol.v1 import MAX_ALLOCATIONS, MAX_CONDITIONS, MAX_GPUS, MAX_NIC_PORTS

log = get_logger("agent.stream")


@dataclass(frozen=True, slots=True)
class HelloInfo:
    node: str
    boot_id: str
    agent_version: str
    gpus: list[GpuInfo] = field(default_factory=list)
    expected_gpus: int | None = None
    capabilities: list[str] = field(default_factory=list)
    """What the agent can execute for the remediation loop
    (``gpuhealth.agent.remediation.order_handler``)."""


class AgentView(Protocol):
    """What the stream needs from the agent runtime."""

    def hello_info(self) -> HelloInfo: ...

    def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
        """Every GPU's current health, and the current allocations."""

    def allocations_unknown(self) -> str | None:
        """Why the allocations may not be the kubelet's now; None when they are."""

    def node_conditions(self) -> list[Condition]:
        """Verdicts about the node no GPU carries (fewer GPUs visible than expected)."""

    def nics(self) -> list[NicPortInfo]:
        """The node's InfiniBand and RoCE ports and the GPUs behind them."""

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        """Allocation usage since the previous heartbeat, and per-GPU telemetry."""


class OrderReceiver(Protocol):
    """Takes the controller's remediation orders
    (:class:`gpuhealth.agent.remediation.order_handler.OrderHandler`); its reports go through the
    outbox like every other agent message."""

    def connection_started(self) -> None:
        """A new connection: order ``seq`` numbers start again."""

    def receive(self, order: Order) -> None:
        """Called on the event loop for every order frame; never blocks."""


class StreamClosed(TransientError):
    """The controller closed the stream or answered with an Error."""


class ComeBackLater(StreamClosed):
    """The controller is pacing admissions: come back after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def error_from_controller(msg: Error) -> StreamClosed:
    """The exception an Error frame ends the connection with (logged, unless it is the
    controller pacing admissions)."""
    text = f"controller error {msg.code}: {msg.message}"
    if msg.code is ErrorCode.RATE_LIMITED and msg.retry_after_s is not None:
        return ComeBackLater(text, msg.retry_after_s)
    log.warning("stream_error_from_controller", code=str(msg.code), message=msg.message)
    return StreamClosed(text)


def refusal_from_controller(exc: aiohttp.WSServerHandshakeError) -> StreamClosed:
    """The controller refused the upgrade: HTTP 503 with ``Retry-After`` in seconds is it pacing
    admissions before the upgrade (come back then); any other refusal is a failure."""
    text = f"controller refused the stream: HTTP {exc.status} {exc.message}"
    retry = retry_after_from_header(exc.headers.get("Retry-After") if exc.headers else None)
    if exc.status == 503 and retry is not None:
        return ComeBackLater(text, retry)
    return StreamClosed(text)


def controller_frame(raw: aiohttp.WSMessage, otherwise: str) -> ControllerFrame:
    """The controller's message in a binary frame; anything else ends the connection."""
    if raw.type is not aiohttp.WSMsgType.BINARY:
        raise StreamClosed(f"{otherwise} ({raw.type.name})")
    try:
        return decode_controller(raw.data)
    except ProtocolError as exc:
        raise StreamClosed(f"bad frame from the controller: {exc}") from exc


def make_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """Verify the controller's certificate against ``ca_file`` (the system CAs when None)."""
    return ssl.create_default_context(cafile=ca_file)


def event_from_transition(seq: int, node: str, t: Transition) -> Event:
    return Event(
        seq=seq,
        node=node,
        at=t.at,
        kind=t.kind,
        gpu_uuid=t.uuid,
        gpu_index=t.index,
        previous=t.previous,
        current=t.current,
        conditions=list(t.conditions[:MAX_CONDITIONS]),
        xid=t.xid,
        detail=t.detail[:1024],
    )


class StreamClient:
    def __init__(
        self,
        settings: StreamClientSettings,
        provider: AgentView,
        outbox: Outbox,
        token: Callable[[], str],
        *,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        orders: OrderReceiver | None = None,
        shards: int = 1,
    ) -> None:
        self.settings = settings
        self._orders = orders
        self.provider = provider
        self.outbox = outbox
        self.metrics: StreamMetrics = outbox.metrics
        self._token = token
        self._ssl = ssl_context
        self._clock = clock or SystemClock()
        self._backoff = Backoff(
            settings.backoff, rand, stable_after_s=settings.backoff.reset_after_s
        )
        self._rand = rand
        self._wake = asyncio.Event()
        self._sent_at: deque[tuple[int, float]] = deque()
        """(seq, monotonic send time) of messages sent on this connection, oldest first."""
        self._node = provider.hello_info().node
        self.route = ShardRoute.for_node(settings.url, shards, self._node)
        """The controller URL dialled: ``settings.url`` with its ``{shard}``, of ``shards``."""
        self.metrics.shard = self.route.shard
        outbox.listener = self._wake.set

    # -- producers (called by the agent runtime, synchronous, never block) ------------------

    def publish(self, transition: Transition) -> None:
        """Queue a health transition or XID as an Event (durably, before returning)."""
        self._append(lambda seq: event_from_transition(seq, self._node, transition))

    def queue_heartbeat(self) -> None:
        usage, telemetry = self.provider.heartbeat()
        self._append(
            lambda seq: Heartbeat(
                seq=seq,
                node=self._node,
                at=self._clock.now(),
                usage=usage[:MAX_ALLOCATIONS],
                telemetry=telemetry[:MAX_GPUS],
            )
        )

    def queue_snapshot(self) -> None:
        """Queue a full Snapshot (replacing any unsent one): on connect, and when the node's
        allocations, its own conditions, a GPU's MIG devices or its NIC ports change, since
        Events carry health only."""
        gpus, allocations = self.provider.snapshot()
        node_conditions = self.provider.node_conditions()
        nics = self.provider.nics()
        unknown = self.provider.allocations_unknown()
        self._append(
            lambda seq: Snapshot(
                seq=seq,
                node=self._node,
                taken_at=self._clock.now(),
                gpus=gpus[:MAX_GPUS],
                allocations=allocations[:MAX_ALLOCATIONS],
                allocations_unknown=None if unknown is None else unknown[:1024],
                node_conditions=node_conditions[:MAX_CONDITIONS],
                nics=nics[:MAX_NIC_PORTS],
            )
        )

    def _append(self, make: Callable[[int], OutboxMessage]) -> None:
        try:
            self.outbox.append(make)
        except ProtocolError as exc:
            self.metrics.dropped["invalid"] += 1
            log.error("stream_message_invalid", error=str(exc))

    # -- tasks ----------------------------------------------------------------------------

    def start(self, supervisor: Supervisor) -> None:
        supervisor.start("stream-connection", self.run)
        supervisor.start("stream-heartbeat", self.run_heartbeats)

    async def run_heartbeats(self) -> None:
        while True:
            await self._clock.sleep(self.settings.heartbeat_interval_s)
            self.queue_heartbeat()

    async def run(self) -> None:
        """Connect, stream until the connection ends, back off, repeat; until cancelled."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                started = self._clock.monotonic()
                try:
                    await self._connect_once(http)
                except ComeBackLater as exc:
                    self.metrics.connected = False
                    self.metrics.deferred += 1
                    delay = stretched(
                        exc.retry_after_s, self.settings.backoff.retry_after_jitter, self._rand
                    )
                    log.info(
                        "stream_come_back_later",
                        told_s=exc.retry_after_s,
                        seconds=round(delay, 3),
                    )
                    await self._clock.sleep(delay)
                    continue
                except (aiohttp.ClientError, OSError, TimeoutError, TransientError) as exc:
                    log.warning("stream_disconnected", error=f"{type(exc).__name__}: {exc}")
                finally:
                    self.metrics.connected = False
                delay = self._backoff.after_run(self._clock.monotonic() - started)
                log.info(
                    "stream_reconnect_in", seconds=round(delay, 3), attempt=self._backoff.attempt
                )
                await self._clock.sleep(delay)

    async def _connect_once(self, http: aiohttp.ClientSession) -> None:
        token = self._token()
        try:
            async with self._clock.timeout(self.settings.connect_timeout_s):
                ws = await self._ws_connect(http, token, self.provider.hello_info().node)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status == 503 and exc.headers:
                self._follow_owner(exc.headers.get(SHARD_HEADER))
            raise refusal_from_controller(exc) from exc
        async with ws:
            info = self.provider.hello_info()  # as of now, not of before the connect
            hello = Hello(
                seq=self.outbox.first_unacked_seq(),
                node=info.node,
                stream_id=self.outbox.stream_id,
                boot_id=info.boot_id,
                agent_version=info.agent_version,
                gpus=info.gpus[:MAX_GPUS],
                expected_gpus=info.expected_gpus,
                capabilities=info.capabilities,
            )
            await ws.send_bytes(encode(hello))
            if self._orders is not None:
                self._orders.connection_started()
            log.info("stream_hello_sent", url=self.route.url, pending=len(self.outbox))
            accepted = await self._await_accept(ws)
            self.metrics.connected = True
            self.metrics.connects += 1
            self.outbox.ack(accepted.seq)
            self.queue_snapshot()
            self._sent_at.clear()
            tasks = {
                asyncio.create_task(self._send_loop(ws), name="stream-send"),
                asyncio.create_task(self._read_loop(ws), name="stream-read"),
                asyncio.create_task(self._ack_watchdog(), name="stream-ack-watchdog"),
            }
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
                self.metrics.disconnects += 1
            for t in done:
                t.result()

    def _follow_owner(self, header: str | None) -> None:
        """The replica dialled does not own this node's shard: dial the one it names from now
        on (the wait is the refusal's ``Retry-After``, as for any come-back-later)."""
        before = self.route.shard
        try:
            moved = self.route.follow(header)
        except ProtocolError as exc:
            self.metrics.bad_shard_headers += 1
            log.warning("stream_shard_header_ignored", error=str(exc), shard=before)
            return
        if moved:
            self.metrics.shard = self.route.shard
            self.metrics.shard_moves += 1
            log.info("stream_shard_moved", previous=before, shard=self.route.shard)

    async def _ws_connect(
        self, http: aiohttp.ClientSession, token: str, node: str
    ) -> aiohttp.ClientWebSocketResponse:
        return await http.ws_connect(
            self.route.url,
            headers={"Authorization": f"Bearer {token}", NODE_HEADER: node},
            ssl=self._ssl if self._ssl is not None else True,
            heartbeat=self.settings.ws_ping_interval_s,
            timeout=aiohttp.ClientWSTimeout(
                ws_receive=None, ws_close=self.settings.close_timeout_s
            ),
            max_msg_size=MAX_FRAME_BYTES,
            autoping=True,
        )

    async def _await_accept(self, ws: aiohttp.ClientWebSocketResponse) -> Ack:
        """The controller's answer to Hello: its first Ack, or an Error (raised)."""
        try:
            async with self._clock.timeout(self.settings.accept_timeout_s):
                raw = await ws.receive()
        except TimeoutError as exc:
            raise StreamClosed(
                f"no answer to Hello within {self.settings.accept_timeout_s} s"
            ) from exc
        msg = controller_frame(raw, "connection closed before acceptance")
        if isinstance(msg, Error):
            raise error_from_controller(msg)
        if not isinstance(msg, Ack):
            raise StreamClosed("the controller sent an order before accepting the stream")
        return msg

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        sent = self.outbox.acked
        while True:
            self._wake.clear()
            entry = self.outbox.next_after(max(sent, self.outbox.acked))
            in_flight = self.outbox.count_through(sent)
            if entry is None or in_flight >= self.settings.max_in_flight:
                await self._wake.wait()
                continue
            await ws.send_bytes(entry.frame)
            sent = entry.seq
            self._sent_at.append((sent, self._clock.monotonic()))

    async def _ack_watchdog(self) -> None:
        # The controller may hold back the Ack of a heartbeat until the next one arrives.
        timeout = max(self.settings.ack_timeout_s, 3 * self.settings.heartbeat_interval_s)
        while True:
            await self._clock.sleep(timeout / 4)
            acked = self.outbox.acked
            while self._sent_at and self._sent_at[0][0] <= acked:
                self._sent_at.popleft()
            if self._sent_at and self._clock.monotonic() - self._sent_at[0][1] > timeout:
                raise StreamClosed(f"no Ack for seq {self._sent_at[0][0]} within {timeout} s")

    async def _read_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for raw in ws:
            msg = controller_frame(raw, "unexpected frame from the controller")
            if isinstance(msg, Ack):
                self.outbox.ack(msg.seq)
                self._wake.set()
            elif isinstance(msg, Error):
                raise error_from_controller(msg)
            elif self._orders is not None:
                self._orders.receive(msg)
            else:
                log.warning("stream_order_ignored", order=msg.order_id, why="no order handler")
        raise StreamClosed(f"connection closed (code {ws.close_code})")
