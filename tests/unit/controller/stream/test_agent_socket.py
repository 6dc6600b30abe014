"""The agent stream's WebSocket: aiohttp's for the handshake, then handed over to our protocol.

At the socket's level (a real aiohttp server on 127.0.0.1 and a real client) and through the
whole stream server: frames that came before the hand-over go through the handler task in
order, the ones after it to the stream as they are parsed; a ping is answered, a close echoed,
a refused frame answered and the connection closed, an oversized one closed with 1009.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
import trustme
import uvloop
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.http.limits import ConnectionLimits, GuardedSite, app_runner
from gpuhealth.controller.http.settings import HttpSettings
from gpuhealth.controller.stream.agent_socket import AgentSocket, AgentStream
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import Ack, Error, ErrorCode
from gpuhealth.protocol.codec import decode_controller
from tests.support.clock import FakeClock
from tests.support.stream import RecordingSink, event_frame, hello_frame
from tests.support.wait import until
from tests.unit.controller.stream.test_server import Env, done, raw, replies, start, table


class _App:
    """One AgentSocket handler: the first ``take_after`` messages and the ``queued_first``
    that follow through ``receive()``; then the connection handed over to an AgentStream
    whose frames go to ``taken`` (binary ones acknowledged with ``ack:`` and the payload,
    ``refuse`` refused), told to the client with a ``ready`` frame."""

    def __init__(self, *, take_after: int = 1, queued_first: int = 1) -> None:
        self.take_after = take_after
        self.queued_first = queued_first
        self.taken: list[tuple[WSMsgType, object]] = []
        self.received: list[tuple[WSMsgType, object]] = []
        self.lost = 0
        self.stream: AgentStream | None = None
        self.handler_done = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = AgentSocket(compress=False, max_msg_size=1024)
        await ws.prepare(request)
        for _ in range(self.take_after):  # the handshake, through the task
            msg = await ws.receive()
            self.received.append((msg.type, msg.data))
        async with asyncio.timeout(3):
            while ws.queued < self.queued_first:  # frames queued before the hand-over
                await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError):
            ws.hand_over(self, close_timeout_s=0.2)
        while not ws.can_hand_over:  # read first, in order
            msg = await ws.receive()
            self.received.append((msg.type, msg.data))
        await ws.send_bytes(b"ready")
        self.stream = ws.hand_over(self, close_timeout_s=0.2)
        self.handler_done.set()
        return ws

    def on_message(self, mtype: WSMsgType, data: object) -> Error | None:
        self.taken.append((mtype, data))
        if mtype is WSMsgType.BINARY and data != b"refuse":
            assert self.stream is not None and isinstance(data, bytes)
            self.stream.write_binary(b"ack:" + data)
            return None
        if mtype is WSMsgType.ERROR:
            return None
        return Error(code=ErrorCode.MALFORMED, message="refused")

    def on_lost(self) -> None:
        self.lost += 1


@pytest.fixture
async def app() -> AsyncIterator[tuple[_App, str]]:
    a = _App()
    web_app = web.Application()
    web_app.router.add_get("/ws", a.handle)
    ts = TestServer(web_app, host="127.0.0.1", port=0)
    await ts.start_server()
    yield a, f"ws://127.0.0.1:{ts.port}/ws"
    await ts.close()


async def _read(ws: aiohttp.ClientWebSocketResponse, n: int) -> list[bytes]:
    out: list[bytes] = []
    async with asyncio.timeout(3):
        while len(out) < n:
            msg = await ws.receive()
            assert msg.type is WSMsgType.BINARY, msg
            out.append(msg.data)
    return out


async def _connect(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(url, autoping=False, autoclose=False)
    await ws.send_bytes(b"hello")  # read by the task
    await ws.send_bytes(b"early")  # queued before the hand-over: read by the task too
    assert await _read(ws, 1) == [b"ready"]
    return ws


async def _ended(a: _App) -> None:
    async with asyncio.timeout(3):
        while not a.lost:
            await asyncio.sleep(0.01)


async def test_after_the_hand_over_frames_reach_the_stream_in_order(
    app: tuple[_App, str],
) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, url)
        await a.handler_done.wait()
        for i in range(5):
            await ws.send_bytes(f"frame-{i}".encode())
        assert await _read(ws, 5) == [f"ack:frame-{i}".encode() for i in range(5)]
        await ws.ping(b"p")  # answered by the stream itself
        async with asyncio.timeout(3):
            pong = await ws.receive()
        assert (pong.type, pong.data) == (WSMsgType.PONG, b"p")
        await ws.close()  # echoed with 1000, and the connection ends
        assert ws.close_code == aiohttp.WSCloseCode.OK
    await _ended(a)
    assert a.received == [(WSMsgType.BINARY, b"hello"), (WSMsgType.BINARY, b"early")]
    assert a.taken == [(WSMsgType.BINARY, f"frame-{i}".encode()) for i in range(5)]
    assert a.lost == 1
    assert a.stream is not None and a.stream.closed
    assert a.stream.write_binary(b"late") is False
    with pytest.raises(ConnectionResetError):
        await a.stream.send_bytes(b"late")


@pytest.mark.parametrize("kind", ["text", "refused"])
async def test_a_refused_frame_is_answered_and_closes(app: tuple[_App, str], kind: str) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, url)
        if kind == "text":
            await ws.send_str("text")
        else:
            await ws.send_bytes(b"refuse")
        await ws.send_bytes(b"after")  # past the refusal: never applied
        got = await _read(ws, 1)
        assert decode_controller(got[0]) == Error(code=ErrorCode.MALFORMED, message="refused")
        async with asyncio.timeout(3):
            close = await ws.receive()
        assert close.type is WSMsgType.CLOSE
        assert (close.data, close.extra) == (aiohttp.WSCloseCode.POLICY_VIOLATION, "malformed")
        await ws.close()
    await _ended(a)
    assert [m for m, _ in a.taken] == [WSMsgType.TEXT if kind == "text" else WSMsgType.BINARY]


async def test_an_oversized_frame_closes_with_1009(app: tuple[_App, str]) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, url)
        await ws.send_bytes(b"x" * 2048)  # max_msg_size is 1024
        async with asyncio.timeout(3):
            close = await ws.receive()
        assert close.type is WSMsgType.CLOSE
        assert close.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    await _ended(a)
    assert [m for m, _ in a.taken] == [WSMsgType.ERROR]


async def test_an_agent_that_does_not_answer_a_close_is_cut_after_close_timeout(
    app: tuple[_App, str],
) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, url)
        assert a.stream is not None
        assert a.stream.start_close(aiohttp.WSCloseCode.GOING_AWAY, b"shutdown")
        assert a.stream.start_close(aiohttp.WSCloseCode.GOING_AWAY) is False  # once
        async with asyncio.timeout(3):
            close = await ws.receive()  # read, never answered (autoclose off)
        assert (close.type, close.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.GOING_AWAY)
        await ws.send_bytes(b"ignored")  # after the close: not applied
        await _ended(a)  # close_timeout_s (0.2 s) later
        async with asyncio.timeout(3):
            assert (await ws.receive()).type in (WSMsgType.CLOSED, WSMsgType.ERROR)
    assert a.taken == []


async def test_keep_alive_pings_a_silent_agent_and_cuts_one_that_stays_silent(
    app: tuple[_App, str],
) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, url)
        stream = a.stream
        assert stream is not None
        assert stream.keep_alive()  # the "ready" round: the agent was heard, no ping
        assert stream.keep_alive()  # silent since: pinged
        async with asyncio.timeout(3):
            ping = await ws.receive()
        assert ping.type is WSMsgType.PING
        await ws.pong(ping.data)
        async with asyncio.timeout(3):
            while not stream.seen:
                await asyncio.sleep(0.01)
        assert stream.keep_alive()  # it answered: still alive, no ping
        assert stream.keep_alive()  # silent again: pinged
        assert stream.keep_alive() is False  # and no answer by the next round: cut
        await _ended(a)


async def test_hand_over_before_prepare_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        AgentSocket().hand_over(_App(), close_timeout_s=1.0)


# -- through the stream server ---------------------------------------------------------------


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = await start(StreamServerSettings(hello_timeout_s=1.0, rate_burst=1000))
    yield e
    await e.ts.close()


async def _acks(ws: aiohttp.ClientWebSocketResponse, n: int) -> list[object]:
    return [decode_controller(d) for d in await _read(ws, n)]


async def test_frames_pipelined_behind_hello_are_applied_in_order_once(env: Env) -> None:
    """Everything sent before the Hello was answered goes through the handler task; what
    follows through the parser's callback; each applied once, in order, and acknowledged."""
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    for seq in range(2, 6):  # not waiting for the Hello's Ack
        await ws.send_bytes(event_frame(seq, "node-b"))
    got = await _acks(ws, 5)
    assert got[0] == Ack(seq=0)
    assert [a.seq for a in got[1:] if isinstance(a, Ack)] == [2, 3, 4, 5]
    for seq in range(6, 10):  # after the takeover
        await ws.send_bytes(event_frame(seq, "node-b"))
    assert [a.seq for a in await _acks(ws, 4) if isinstance(a, Ack)] == [6, 7, 8, 9]
    assert [e.xid for e in env.sink.events("node-b")] == list(range(2, 10))
    assert isinstance(env.server.connections["node-b"].ws, AgentStream)  # handed over
    await done(ws)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (event_frame(3, "node-b"), ErrorCode.OUT_OF_ORDER),  # seq 3 after 5
        (event_frame(9, "node-c"), ErrorCode.FORBIDDEN),
        (b"\xc1garbage", ErrorCode.MALFORMED),
    ],
)
async def test_a_frame_refused_after_the_takeover_is_answered_and_closes(
    env: Env, frame: bytes, code: ErrorCode
) -> None:
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    assert await _acks(ws, 1) == [Ack(seq=0)]
    await ws.send_bytes(event_frame(5, "node-b"))
    assert await _acks(ws, 1) == [Ack(seq=5)]
    await ws.send_bytes(frame)
    got = await replies(ws)
    await done(ws)
    assert isinstance(got[-1], Error) and got[-1].code == code
    assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
    assert env.server.metrics.errors[code.value] == 1
    assert [e.xid for e in env.sink.events("node-b")] == [5]
    await until(lambda: "node-b" not in env.server.connections)


async def test_a_failure_in_the_callback_is_an_internal_error(env: Env) -> None:
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    assert await _acks(ws, 1) == [Ack(seq=0)]

    def boom(node: str, msg: object) -> None:
        raise RuntimeError("fleet bug")

    env.sink.on_message = boom  # type: ignore[method-assign]
    await ws.send_bytes(event_frame(2, "node-b"))
    got = await replies(ws)
    await done(ws)
    assert [e.code for e in got if isinstance(e, Error)] == [ErrorCode.INTERNAL]
    assert env.server.metrics.errors[ErrorCode.INTERNAL.value] == 1
    assert env.server.tracker.applied("node-b", "s1") == 0  # not recorded: replayed later


async def test_an_agent_not_reading_its_acks_is_cut_off(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks are written without waiting for the agent; once more than ``unread_max_bytes``
    sit unread, its stream ends instead of the buffer growing."""
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    assert await _acks(ws, 1) == [Ack(seq=0)]
    await ws.send_bytes(event_frame(2, "node-b"))
    assert await _acks(ws, 1) == [Ack(seq=2)]
    assert env.server.connections["node-b"].ws.unread == 0  # the agent reads: nothing waits
    limit = env.server.settings.unread_max_bytes
    monkeypatch.setattr(AgentStream, "unread", property(lambda _self: limit + 1))
    await ws.send_bytes(event_frame(3, "node-b"))
    got = await replies(ws)
    await done(ws)
    assert got == [Error(code=ErrorCode.RATE_LIMITED, message="acknowledgements not read")]
    assert env.server.metrics.errors[ErrorCode.RATE_LIMITED.value] == 1
    assert [e.xid for e in env.sink.events("node-b")] == [2, 3]  # applied, not acknowledged


async def test_pings_go_to_silent_agents_and_cut_the_ones_that_do_not_answer() -> None:
    """``ws_ping_interval_s``: an agent heard from in a round is not pinged; one silent for a
    round is; one that answered nothing by the next round is disconnected."""
    clock = FakeClock()
    sink = RecordingSink()
    settings = StreamServerSettings(ws_ping_interval_s=30, rate_burst=1000)
    server = StreamServer(settings, table(), sink, clock=clock)
    web_app = web.Application()
    server.add_routes(web_app)
    ts = TestServer(web_app, host="127.0.0.1", port=0)
    await ts.start_server()
    pings = asyncio.create_task(server.run_pings())
    try:
        async with aiohttp.ClientSession() as http:
            url = f"ws://127.0.0.1:{ts.port}/v1/stream"
            headers = {"Authorization": "Bearer tok-node-b"}
            ws = await http.ws_connect(url, headers=headers, autoping=False)
            await ws.send_bytes(hello_frame("node-b", seq=1))
            assert await _acks(ws, 1) == [Ack(seq=0)]
            await clock.advance_and_settle(30)  # heard from (the Hello): no ping
            await ws.send_bytes(event_frame(2, "node-b"))
            assert await _acks(ws, 1) == [Ack(seq=2)]
            await clock.advance_and_settle(30)  # the Event: still no ping
            await clock.advance_and_settle(30)  # silent for a round: pinged
            async with asyncio.timeout(3):
                ping = await ws.receive()
            assert ping.type is WSMsgType.PING
            await ws.pong(ping.data)
            stream = server.connections["node-b"].ws
            assert isinstance(stream, AgentStream)
            await until(lambda: stream.seen)
            await clock.advance_and_settle(30)  # it answered: kept
            assert "node-b" in server.connections
            await clock.advance_and_settle(30)  # silent again: pinged
            async with asyncio.timeout(3):
                assert (await ws.receive()).type is WSMsgType.PING
            await clock.advance_and_settle(30)  # no answer: cut
            async with asyncio.timeout(3):
                assert (await ws.receive()).type in (WSMsgType.CLOSED, WSMsgType.CLOSE)
            await until(lambda: "node-b" not in server.connections)
            assert sink.disconnects == ["node-b"]
    finally:
        pings.cancel()
        await ts.close()


async def _handed_over_stream(server_ctx: ssl.SSLContext | None, client_ctx: object) -> None:
    """A stream handed over on this event loop: frames applied and acknowledged, a ping
    answered, and the drain's close (1001) delivered."""
    e = await start(StreamServerSettings(rate_burst=1000), server_ctx)
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": "Bearer tok-node-b"}
            ws = await http.ws_connect(e.url, headers=headers, ssl=client_ctx, autoping=False)
            await ws.send_bytes(hello_frame("node-b", seq=1))
            assert await _acks(ws, 1) == [Ack(seq=0)]
            for seq in range(2, 12):
                await ws.send_bytes(event_frame(seq, "node-b"))
            assert [a.seq for a in await _acks(ws, 10) if isinstance(a, Ack)] == list(range(2, 12))
            assert isinstance(e.server.connections["node-b"].ws, AgentStream)
            await ws.ping(b"p")
            async with asyncio.timeout(3):
                pong = await ws.receive()
            assert (pong.type, pong.data) == (WSMsgType.PONG, b"p")
            drain = asyncio.create_task(e.server.drain())
            async with asyncio.timeout(3):
                close = await ws.receive()
            assert (close.type, close.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.GOING_AWAY)
            await ws.close()
            async with asyncio.timeout(3):
                await drain
        assert [ev.xid for ev in e.sink.events("node-b")] == list(range(2, 12))
        assert e.server.connections == {}
        assert e.sink.disconnects == ["node-b"]
    finally:
        await e.ts.close()


def _tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server's context for 127.0.0.1 and a client's that trusts it."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    return server_ctx, client_ctx


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_the_hand_over_works_on_uvloop(tls: bool) -> None:
    """The controller's own loop (uvloop), plain and over TLS (its transports too take a new
    protocol)."""
    server_ctx, client_ctx = _tls() if tls else (None, None)
    uvloop.run(_handed_over_stream(server_ctx, client_ctx or True))


async def test_the_hand_over_works_over_tls_on_asyncio() -> None:
    await _handed_over_stream(*_tls())


async def _through_the_guarded_site(tls: bool) -> None:
    """The controller's own listener (``GuardedSite`` behind the limits' middleware): once
    handed over, the stream is no connection of aiohttp's nor of the guard's any more (no
    handler kept, nothing counted as waiting for headers), its frames still applied."""
    server_ctx, client_ctx = _tls() if tls else (None, None)
    sink = RecordingSink()
    server = StreamServer(StreamServerSettings(rate_burst=1000), table(), sink)
    limits = ConnectionLimits(HttpSettings(), None)
    app = web.Application(middlewares=[limits.middleware])
    server.add_routes(app)
    runner = app_runner(app, limits.settings)
    await runner.setup()
    assert runner.server is not None
    site = GuardedSite(runner, "127.0.0.1", 0, limits, ssl_context=server_ctx)
    await site.start()
    url = f"{'wss' if tls else 'ws'}://127.0.0.1:{site.port}/v1/stream"
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": "Bearer tok-node-b"}
            ws = await http.ws_connect(url, headers=headers, ssl=client_ctx or True, autoping=False)
            await ws.send_bytes(hello_frame("node-b", seq=1))
            assert await _acks(ws, 1) == [Ack(seq=0)]
            for seq in range(2, 7):
                await ws.send_bytes(event_frame(seq, "node-b"))
            assert [a.seq for a in await _acks(ws, 5) if isinstance(a, Ack)] == list(range(2, 7))
            assert isinstance(server.connections["node-b"].ws, AgentStream)
            await until(lambda: not runner.server.connections, "aiohttp forgetting the stream")
            assert limits.unready == 0 and not limits.pending
            await ws.close()
        await until(lambda: not server.connections, "the stream's end")
        assert [ev.xid for ev in sink.events("node-b")] == list(range(2, 7))
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_the_hand_over_leaves_the_guarded_site_behind(tls: bool) -> None:
    await _through_the_guarded_site(tls)


def test_the_hand_over_leaves_the_guarded_site_behind_on_uvloop() -> None:
    uvloop.run(_through_the_guarded_site(tls=True))
