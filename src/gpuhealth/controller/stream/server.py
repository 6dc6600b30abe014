"""``GET /v1/stream``: the aiohttp WebSocket handler agents stream to.

A connection must send Hello first (within ``hello_timeout_s``); then
:class:`~gpuhealth.controller.stream.auth.AgentVerifier` says who is on the other end (the token
reviewed, the agent ServiceAccount bound to the node Hello names, its pod alive). When that pod
goes its stream is cut with Error(UNAUTHENTICATED): a token never outlives its pod. One live
connection per node: a newer one replaces the older (Error(REPLACED)). Every later frame goes
through :class:`~gpuhealth.controller.stream.session.Session`; :meth:`StreamServer.send_order`
writes the controller's orders to a node's live connection. Bad input is answered with an Error and
a close of that connection only, and counted; an oversized frame is cut off by aiohttp
(``max_msg_size``, close code 1009) and counted as ``too-large``.

Admission is paced (:mod:`gpuhealth.controller.stream.admission`): at most
``admission_max_concurrent`` handshakes at once, a bounded FIFO of waiting ones, and beyond it "come
back later": at the door, before the upgrade, HTTP 503 with ``Retry-After`` (the node named by the
request's ``Gpuhealth-Node`` header), or, for a Hello whose wait expired, Error(rate-limited) with
``retry_after_s``. A node whose agent waits its turn is reported to ``waiting`` (the fleet
does not call it silent for that). The socket is checked before and after every await of a
handshake: a connection the agent already closed costs no review and no write, and is counted
(``gpuhealth_stream_gone_total``), never logged as a traceback. :meth:`StreamServer.drain`
(shutdown) tells waiting and new agents to come back soon and closes every stream.

Past one process (docs/architecture.md), a replica serves only the nodes of the shards it owns
(``serves``): an agent of another shard is turned away at the door (HTTP 503 with
``Retry-After: not_owner_retry_after_s``, reason ``not_owner``, before any review), or after
its Hello when the upgrade named no node, so that it asks its shard's Service again; where
``shard_of`` knows the node's shard (its Node's label), the 503 names it in the
``Gpuhealth-Shard`` header and the agent goes there. When this replica stops owning a shard,
:meth:`StreamServer.close_unserved` closes its agents' streams (going away).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.stream.admission import (
    AGENT_JITTER_ALLOWANCE,
    Admission,
    Arrival,
    Defer,
    Limits,
)
from gpuhealth.controller.stream.agent_socket import AgentSocket, AgentStream, StreamSocket
from gpuhealth.controller.stream.auth import (
    AgentVerifier,
    Authenticator,
    PodLiveness,
    bearer_token,
)
from gpuhealth.controller.stream.bound_tokens import BoundTokenAuthenticator, TokenFacts
from gpuhealth.controller.stream.metrics import StreamServerMetrics
from gpuhealth.controller.stream.session import (
    TEXT_REFUSED,
    Answers,
    Connection,
    IngestSink,
    ReportSink,
    SeqTracker,
    Session,
    TokenBucket,
)
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import (
    MAX_FRAME_BYTES,
    NODE_HEADER,
    PROTOCOL_VERSION,
    Ack,
    Error,
    ErrorCode,
    Hello,
    ProtocolError,
    encode,
    retry_after_header,
)
from gpuhealth.protocol.codec import decode_agent
from gpuhealth.protocol.remediation import Order
from gpuhealth.protocol.shards import SHARD_HEADER

log = get_logger("controller.stream")

STREAM_PATH = "/v1/stream"
MAX_NODE_NAME = 253
"""The longest node name a ``Gpuhealth-Node`` header may carry (a Kubernetes object name)."""


class StreamServer:
    def __init__(
        self,
        settings: StreamServerSettings,
        authenticator: Authenticator,
        sink: IngestSink,
        *,
        tracker: SeqTracker | None = None,
        clock: Clock | None = None,
        metrics: StreamServerMetrics | None = None,
        pods: PodLiveness | None = None,
        token_facts: TokenFacts | None = None,
        reports: ReportSink | None = None,
        waiting: Callable[[str, float], None] | None = None,
        serves: Callable[[str], bool] | None = None,
        shard_of: Callable[[str], Awaitable[int | None]] | None = None,
    ) -> None:
        self.settings = settings
        self._serves = serves
        """Whether this replica owns the node's shard (None: it serves every node)."""
        self._shard_of = shard_of
        """The shard a node this replica does not serve belongs to, when known."""
        self._waiting = waiting
        self.sink = sink
        self._reports = reports
        self.tracker = tracker if tracker is not None else SeqTracker()
        self.metrics = metrics if metrics is not None else StreamServerMetrics()
        self.connections: dict[str, Connection] = {}
        self._clock = clock or SystemClock()
        self.answers = Answers(
            self._clock, self.metrics, settings.unread_max_bytes, release=self.release
        )
        """How every connection answers its frames (shared: one object, not one per agent)."""
        self.verifier = AgentVerifier(
            settings,
            authenticator,
            self._clock,
            pods,
            local=self._local_verifier(pods, token_facts),
        )
        self.admission = Admission(
            Limits(
                max_concurrent=settings.admission_max_concurrent,
                max_waiting=settings.admission_max_waiting,
                retry_after_min_s=settings.admission_retry_after_min_s,
                retry_after_max_s=settings.admission_retry_after_max_s,
            ),
            self._clock,
            max_wait_s=settings.admission_max_wait_s,
            initial_handshake_s=settings.admission_initial_handshake_s,
        )
        admission = self.admission
        self.metrics.admission = lambda: (
            admission.in_flight,
            admission.waiting,
            admission.arriving,
        )
        self._closing: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[object]] = set()
        """Every running :meth:`handle` (waiting for Hello, admitted or waiting; a stream
        accepted and handed over has none)."""
        if pods is not None:
            pods.subscribe(self.revoke_pod)

    def _local_verifier(
        self, pods: PodLiveness | None, facts: TokenFacts | None
    ) -> Callable[[Authenticator], Authenticator] | None:
        """Bound tokens verified here, with the issuer's keys, the Nodes' UIDs and the pod
        watch (all needed), unless ``auth_local_trust_s`` is 0."""
        s = self.settings
        if pods is None or facts is None or s.auth_local_trust_s <= 0:
            return None
        bound_pods, token_facts = pods, facts

        def local(review: Authenticator) -> Authenticator:
            return BoundTokenAuthenticator(
                token_facts,
                bound_pods,
                review,
                self._clock,
                audience=s.audience,
                namespace=s.agent_namespace,
                service_account=s.agent_service_account,
                trust_s=s.auth_local_trust_s,
                counts=self.metrics.tokens,
            )

        return local

    def revoke_pod(self, uid: str, reason: str) -> None:
        """The pod with this UID is gone: forget its reviews, cut its streams now."""
        self.verifier.forget_pod(uid)
        for conn in [c for c in self.connections.values() if c.pod_uid == uid]:
            conn.session.replaced = True  # nothing more from it is applied
            self.metrics.revoked[reason] += 1
            log.warning("stream_revoked", node=conn.session.node, pod_uid=uid, reason=reason)
            error = Error(
                code=ErrorCode.UNAUTHENTICATED,
                message=f"the agent pod is gone ({reason}): its token is no longer accepted",
            )
            task = asyncio.create_task(self._send_error_close(conn.ws, error))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def send_order(self, node: str, make: Callable[[int], Order]) -> bool:
        """Write a remediation order to ``node``'s live stream on this replica; ``make`` gets
        the order's ``seq`` on that connection. False when there is none, or the write did
        not finish within ``order_send_timeout_s`` (the episode sends it again later)."""
        conn = self.connections.get(node)
        if conn is None or conn.session.replaced or conn.ws.closed:
            return False
        conn.order_seq += 1
        order = make(conn.order_seq)
        try:
            async with self._clock.timeout(self.settings.order_send_timeout_s):
                await conn.ws.send_bytes(encode(order))
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            log.warning("stream_order_not_sent", node=node, order=order.order_id, error=str(exc))
            return False
        self.metrics.orders[type(order).__struct_config__.tag] += 1  # type: ignore[index]
        return True

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(STREAM_PATH, self.handle)
        app.on_shutdown.append(self._on_shutdown)

    async def _on_shutdown(self, _app: web.Application) -> None:
        await self.drain()

    async def drain(self) -> None:
        """Shutting down: waiting and new agents are told to come back soon (to another
        replica), every stream is closed, and a handler still running ``close_timeout_s``
        later (waiting for a Hello, closing) is cancelled."""
        self.admission.drain()
        await self.close_all()
        running = [t for t in self._handlers if t is not asyncio.current_task()]
        if running:
            _, late = await asyncio.wait(running, timeout=self.settings.close_timeout_s)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late, timeout=self.settings.close_timeout_s)
                log.info("stream_handlers_cancelled", count=len(late))

    async def run_pings(self) -> None:
        """Every ``ws_ping_interval_s``: a ping to each accepted agent that sent nothing since
        the last round; one that answered nothing by the next round is disconnected (a
        supervised task, only when pings are on)."""
        interval = self.settings.ws_ping_interval_s
        if interval is None:
            return
        while True:
            await self._clock.sleep(interval)
            for conn in list(self.connections.values()):
                ws = conn.ws
                if isinstance(ws, AgentStream) and not ws.keep_alive():
                    log.warning("stream_unresponsive", node=conn.session.node)

    async def close_all(self) -> None:
        """Close every agent connection (going away), ``close_max_concurrent`` at a time;
        agents reconnect elsewhere."""
        limit = asyncio.Semaphore(self.settings.close_max_concurrent)

        async def close(ws: StreamSocket) -> None:
            async with limit:
                await self._close_going_away(ws)

        conns = list(self.connections.values())
        await asyncio.gather(*(close(c.ws) for c in conns))

    async def close_unserved(self) -> int:
        """Close the stream of every agent whose node this replica no longer serves (a shard
        lost or moved), going away, ``close_max_concurrent`` at a time; returns how many."""
        if self._serves is None:
            return 0
        limit = asyncio.Semaphore(self.settings.close_max_concurrent)
        gone = [c for node, c in list(self.connections.items()) if not self._serves(node)]

        async def close(ws: StreamSocket) -> None:
            async with limit:
                await self._close_going_away(ws)

        await asyncio.gather(*(close(c.ws) for c in gone))
        return len(gone)

    async def _close_going_away(self, ws: StreamSocket) -> None:
        """Each close waits for the agent's close frame at most ``close_timeout_s``."""
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            async with self._clock.timeout(self.settings.close_timeout_s):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"shutdown")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        node = request.headers.get(NODE_HEADER)
        if node is not None and not 0 < len(node) <= MAX_NODE_NAME:
            node = None
        if node is not None and not self._ours(node):
            shard = await self._shard_of(node) if self._shard_of is not None else None
            return self._turned_away(node, self._not_ours(), shard=shard)
        arrival = self.admission.door(node)
        if isinstance(arrival, Defer):
            return self._turned_away(node, arrival)
        ws = AgentSocket(max_msg_size=MAX_FRAME_BYTES, compress=False)
        try:
            await ws.prepare(request)
        except ConnectionError:  # the agent left before its upgrade was answered
            arrival.close()
            self.metrics.gone["upgrade"] += 1
            return ws  # aiohttp finishes a response on a closed connection quietly
        except BaseException:  # not a WebSocket upgrade (400), or cancelled: no longer arriving
            arrival.close()
            raise
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        protocol = request.protocol
        try:
            try:
                conn = await self._handshake(ws, request, arrival)
            finally:
                arrival.close()  # it entered the queue, or it never will
            # The stream keeps only what it needs (node, stream id, pod UID): not the upgrade
            # request, its headers, the bearer token or the Hello (aiohttp's own frames still
            # hold the request while this handler runs).
            del request
            if conn is None:
                return ws
            handed_over = False
            try:
                handed_over = await self._serve(conn, ws)
            finally:
                if not handed_over:
                    self.release(conn)
        except ConnectionError as exc:  # the agent went away mid-write: a reason, not a bug
            self.metrics.gone["stream"] += 1
            log.debug("stream_peer_gone", error=type(exc).__name__)
        except Exception as exc:
            log.exception("stream_handler_failed", error=str(exc))
            transport = protocol.transport
            if transport is not None and not transport.is_closing():
                await self._fail(ws, ErrorCode.INTERNAL, "internal error")
        return ws

    def _ours(self, node: str) -> bool:
        return self._serves is None or self._serves(node)

    def _not_ours(self) -> Defer:
        return Defer(retry_after_s=self.settings.not_owner_retry_after_s, reason="not_owner")

    def _turned_away(
        self, node: str | None, turn: Defer, *, shard: int | None = None
    ) -> web.Response:
        """Come back later, before the upgrade: HTTP 503 with ``Retry-After`` (whole seconds,
        rounded up), the connection closed after it; ``shard``: the shard that owns the node,
        in ``Gpuhealth-Shard``."""
        self.metrics.deferred[turn.reason] += 1
        if self._waiting is not None and node is not None:
            self._waiting(node, turn.retry_after_s * (1.0 + AGENT_JITTER_ALLOWANCE))
        response = web.Response(
            status=503,
            text="the controller is admitting other agents: come back later\n",
            headers={
                "Retry-After": retry_after_header(turn.retry_after_s),
                **({SHARD_HEADER: str(shard)} if shard is not None else {}),
            },
        )
        response.force_close()
        return response

    async def _handshake(
        self, ws: AgentSocket, request: web.Request, arrival: Arrival
    ) -> Connection | None:
        """Hello, admission, review; the accepted connection told to the sink and
        acknowledged. None: the connection was answered (or is gone) and ends."""
        token = bearer_token(request.headers.get("Authorization"))
        hello = await self._await_hello(ws)
        if hello is None:
            return None
        if not self._ours(hello.node):  # the upgrade named no node, or another one
            await self._defer(ws, request, hello, self._not_ours())
            return None
        conn = await self._paced_admit(ws, request, hello, token, arrival)
        if conn is None:
            return None
        try:
            self.sink.on_connect(hello.node, hello)
            applied = self.tracker.applied(hello.node, hello.stream_id)
            await ws.send_bytes(encode(Ack(seq=applied)))
        except BaseException:
            self.release(conn)
            raise
        log.info("stream_accepted", node=hello.node, stream_id=hello.stream_id, applied=applied)
        return conn

    def _gone(self, request: web.Request, stage: str) -> bool:
        """The agent closed this connection (counted under ``stage``): stop working on it."""
        if _gone(request):
            self.metrics.gone[stage] += 1
            return True
        return False

    async def _paced_admit(
        self,
        ws: AgentSocket,
        request: web.Request,
        hello: Hello,
        token: str | None,
        arrival: Arrival,
    ) -> Connection | None:
        """Wait for a turn (or answer come back later), then :meth:`_admit` within it. aiohttp
        cancels the handler when its connection is lost: that is counted too, by stage."""
        if self._gone(request, "hello"):
            return None
        if self._waiting is not None and self.admission.busy:
            # the controller is why this agent is quiet, at most until it is answered
            self._waiting(hello.node, self.settings.admission_max_wait_s)
        stage = "queued"
        try:
            async with self.admission.turn(arrival, hello.node) as deferred:
                if deferred is not None:
                    await self._defer(ws, request, hello, deferred)
                    return None
                if self._gone(request, stage):
                    return None
                stage = "review"
                return await self._admit(ws, request, hello, token)
        except asyncio.CancelledError:
            if _gone(request):
                self.metrics.gone[stage] += 1
            raise

    async def _defer(
        self, ws: AgentSocket, request: web.Request, hello: Hello, turn: Defer
    ) -> None:
        """Tell the agent to come back after ``turn.retry_after_s``."""
        self.metrics.deferred[turn.reason] += 1
        if self._waiting is not None:  # until it is back: told N s, plus its jitter
            self._waiting(hello.node, turn.retry_after_s * (1.0 + AGENT_JITTER_ALLOWANCE))
        if self._gone(request, "queued"):
            return
        log.debug("stream_deferred", node=hello.node, retry_after_s=turn.retry_after_s)
        error = Error(
            code=ErrorCode.RATE_LIMITED,
            message="the controller is admitting other agents: come back later",
            retry_after_s=round(turn.retry_after_s, 3),
        )
        await self._send_error_close(ws, error)

    async def _await_hello(self, ws: AgentSocket) -> Hello | None:
        try:
            async with self._clock.timeout(self.settings.hello_timeout_s):
                raw = await ws.receive()
        except TimeoutError:
            self.metrics.rejected["hello_timeout"] += 1
            await self._fail(ws, ErrorCode.OUT_OF_ORDER, "no Hello in time")
            return None
        data = await self._frame_data(ws, raw.type, raw.data)
        if data is None:
            return None
        try:
            msg = decode_agent(data)
        except ProtocolError as exc:
            await self._fail(ws, ErrorCode(exc.code), str(exc))
            return None
        if not isinstance(msg, Hello):
            await self._fail(ws, ErrorCode.OUT_OF_ORDER, "the first frame must be Hello")
            return None
        if msg.protocol != PROTOCOL_VERSION:
            await self._fail(
                ws, ErrorCode.UNSUPPORTED_VERSION, f"protocol {msg.protocol} is not supported"
            )
            return None
        return msg

    async def _admit(
        self, ws: AgentSocket, request: web.Request, hello: Hello, token: str | None
    ) -> Connection | None:
        verified = await self.verifier.verify(
            token, hello.node, request.remote, lambda stage: self._gone(request, stage)
        )
        if verified is None:
            return None
        identity, decision = verified
        if not decision.ok:
            self.metrics.rejected[decision.reason] += 1
            log.warning(
                "stream_rejected",
                reason=decision.reason,
                claimed_node=hello.node,
                username=identity.username if identity else None,
                token_node=identity.node_name if identity else None,
                token_pod=identity.pod_name if identity else None,
                review_error=identity.error if identity else None,
                peer=request.remote,
            )
            assert decision.code is not None
            await self._send_error_close(ws, Error(code=decision.code, message=decision.message))
            return None
        if self._gone(request, "accept"):
            return None
        if self.admission.draining:  # shutting down: reviewed, but not accepted here
            self.metrics.deferred["draining"] += 1
            retry = self.admission.limits.retry_after_min_s
            error = Error(code=ErrorCode.RATE_LIMITED, message="shutting down", retry_after_s=retry)
            await self._send_error_close(ws, error)
            return None
        s = self.settings
        bucket = TokenBucket(s.rate_per_s, s.rate_burst, self._clock.monotonic())
        session = Session(
            hello,
            self.sink,
            self.tracker,
            self.metrics,
            bucket,
            heartbeat_ack_every=s.heartbeat_ack_every,
            reports=self._reports,
        )
        conn = Connection(
            ws, session, self.answers, pod_uid=(identity.pod_uid or "") if identity else ""
        )
        old = self.connections.get(hello.node)
        self.connections[hello.node] = conn
        self.metrics.messages["hello"] += 1
        if old is not None:
            old.session.replaced = True
            log.info("stream_replaced", node=hello.node)
            await self._send_error_close(
                old.ws, Error(code=ErrorCode.REPLACED, message="a newer connection replaced this")
            )
        return conn

    async def _serve(self, conn: Connection, ws: AgentSocket) -> bool:
        """Frames that came before the stream was accepted go through this task, in order;
        then the connection is handed over to an :class:`AgentStream` (True), which applies
        each frame where it is parsed (:meth:`Connection.on_message`) and releases the
        connection when it ends. False: the stream ended first."""
        while not ws.can_hand_over:
            if not await self._next(conn, ws):
                return False
        conn.ws = ws.hand_over(conn, close_timeout_s=self.settings.close_timeout_s)
        return True

    async def _next(self, conn: Connection, ws: AgentSocket) -> bool:
        """One message through this task; False: the stream has ended."""
        raw = await ws.receive()
        data = await self._frame_data(ws, raw.type, raw.data)
        del raw  # nothing of a frame outlives its handling
        if data is None:
            return False
        error = conn.apply(data)
        del data
        if error is not None:
            await self._send_error_close(ws, error)
            return False
        return True

    def release(self, conn: Connection) -> None:
        """``conn`` has ended: it is no longer the node's connection."""
        node = conn.session.node
        if self.connections.get(node) is conn:
            del self.connections[node]
            self.sink.on_disconnect(node)

    async def _frame_data(self, ws: AgentSocket, mtype: WSMsgType, data: object) -> bytes | None:
        """The payload of a binary frame; anything else is answered (or the peer is gone)."""
        if mtype is WSMsgType.BINARY and isinstance(data, bytes):
            return data
        if mtype is WSMsgType.TEXT:
            await self._fail(ws, ErrorCode.MALFORMED, TEXT_REFUSED)
        elif mtype is WSMsgType.ERROR:
            self.answers.frame_error(data)
        return None

    async def _fail(self, ws: AgentSocket, code: ErrorCode, message: str) -> None:
        self.metrics.errors[code.value] += 1
        await self._send_error_close(ws, Error(code=code, message=message[:1024]))

    async def _send_error_close(self, ws: StreamSocket, error: Error) -> None:
        """Best effort: the peer may be gone already (nothing is logged then)."""
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            async with self._clock.timeout(self.settings.close_timeout_s):
                if not ws.closed:
                    await ws.send_bytes(encode(error))
                await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=error.code.value.encode())


def _gone(request: web.Request) -> bool:
    """The connection was lost or is being closed (aiohttp drops the transport on loss)."""
    transport = request.transport
    return transport is None or transport.is_closing()
