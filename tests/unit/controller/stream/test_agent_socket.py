"""The agent stream's WebSocket: binary frames handled where they are parsed, the rest queued.

At the socket's level (a real aiohttp server on 127.0.0.1 and a real client) and through the
whole stream server: frames that came before the stream was accepted go through the handler
task in order, the ones after it through the parser's callback; a frame refused there is
still answered and the connection closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp._websocket.reader import WebSocketDataQueue
from aiohttp.http_websocket import WebSocketReader
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream.agent_socket import AgentSocket, binary_frame
from gpuhealth.protocol import Ack, Error, ErrorCode
from gpuhealth.protocol.codec import decode_controller
from tests.support.stream import event_frame, hello_frame
from tests.support.wait import until
from tests.unit.controller.stream.test_server import Env, done, raw, replies, start


class _Protocol:
    """What aiohttp's frame queue asks of its connection."""

    _reading_paused = False

    def pause_reading(self) -> None: ...


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65_535, 65_536, 70_000])
async def test_binary_frame_is_what_a_websocket_peer_reads(n: int) -> None:
    payload = bytes(i % 251 for i in range(n))
    frame = binary_frame(payload)
    assert frame[0] == 0x82  # FIN, binary, unmasked (a server's frame)
    assert len(frame) == n + (2 if n < 126 else 4 if n < 65_536 else 10)
    queue = WebSocketDataQueue(_Protocol(), 1 << 20, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    reader = WebSocketReader(queue, 0, False, False)
    assert reader.feed_data(frame[:3]) == (False, b"")  # split anywhere: still one frame
    reader.feed_data(frame[3:])
    msg = await queue.read()
    assert (msg.type, msg.data) == (WSMsgType.BINARY, payload)
    assert not queue._buffer


class _App:
    """One AgentSocket handler: the first ``take_after`` messages and the ``queued_first``
    that follow through ``receive()``; then binary frames to ``taken`` (acknowledged with
    ``ack:`` and the payload), told to the client with a ``ready`` frame; whatever
    ``receive()`` still returns goes to ``received``."""

    def __init__(self, *, take_after: int = 1, queued_first: int = 1) -> None:
        self.take_after = take_after
        self.queued_first = queued_first
        self.taken: list[bytes] = []
        self.received: list[tuple[WSMsgType, object]] = []
        self.socket: AgentSocket | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = AgentSocket(compress=False)
        await ws.prepare(request)
        self.socket = ws
        for _ in range(self.take_after):  # the handshake, through the task
            msg = await ws.receive()
            self.received.append((msg.type, msg.data))
        async with asyncio.timeout(3):
            while ws.queued < self.queued_first:  # frames queued before the takeover
                await asyncio.sleep(0.01)
        while ws.queued:  # read first, in order
            msg = await ws.receive()
            self.received.append((msg.type, msg.data))

        def on_binary(data: bytes) -> bool:
            if data == b"refuse":
                return False  # left to the task
            self.taken.append(data)
            ws.write_binary(b"ack:" + data)
            return True

        ws.take_binary(on_binary)
        await ws.send_bytes(b"ready")
        while True:
            msg = await ws.receive()
            self.received.append((msg.type, msg.data))
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING):
                return ws
            if msg.type is WSMsgType.BINARY:  # a refused frame: answer and close
                await ws.send_bytes(b"refused")
                await ws.close()
                return ws


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


async def test_binary_frames_skip_the_task_control_frames_do_not(app: tuple[_App, str]) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http, http.ws_connect(url, autoping=False) as ws:
        await ws.send_bytes(b"hello")  # read by the task
        await ws.send_bytes(b"early")  # queued before the takeover: read by the task too
        assert await _read(ws, 1) == [b"ready"]
        for i in range(5):
            await ws.send_bytes(f"frame-{i}".encode())
        assert await _read(ws, 5) == [f"ack:frame-{i}".encode() for i in range(5)]
        await ws.ping(b"p")  # a control frame still reaches aiohttp's own handling
        async with asyncio.timeout(3):
            pong = await ws.receive()
        assert pong.type is WSMsgType.PONG and pong.data == b"p"
        await ws.send_str("text")
        await ws.send_bytes(b"refuse")
        assert await _read(ws, 1) == [b"refused"]
    assert a.received[:2] == [(WSMsgType.BINARY, b"hello"), (WSMsgType.BINARY, b"early")]
    assert a.taken == [f"frame-{i}".encode() for i in range(5)]
    # after the takeover the task saw only what it must answer: the text, the refused frame
    assert a.received[2:] == [(WSMsgType.TEXT, "text"), (WSMsgType.BINARY, b"refuse")]


async def test_write_binary_on_a_closed_socket_is_refused(app: tuple[_App, str]) -> None:
    a, url = app
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_bytes(b"hello")
        await ws.send_bytes(b"early")
        assert await _read(ws, 1) == [b"ready"]
        await ws.close()
    assert a.socket is not None
    async with asyncio.timeout(3):
        while not a.socket.closed:
            await asyncio.sleep(0.01)
    assert a.socket.write_binary(b"late") is False


def test_take_binary_before_prepare_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        AgentSocket().take_binary(None)


# -- through the stream server ---------------------------------------------------------------


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    from gpuhealth.controller.stream.settings import StreamServerSettings

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
    conn = env.server.connections["node-b"]
    assert conn.ws.queued == 0
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
    monkeypatch.setattr(AgentSocket, "unread", property(lambda _self: limit + 1))
    await ws.send_bytes(event_frame(3, "node-b"))
    got = await replies(ws)
    await done(ws)
    assert got == [Error(code=ErrorCode.RATE_LIMITED, message="acknowledgements not read")]
    assert env.server.metrics.errors[ErrorCode.RATE_LIMITED.value] == 1
    assert [e.xid for e in env.sink.events("node-b")] == [2, 3]  # applied, not acknowledged
