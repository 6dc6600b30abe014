"""After the handshake a stream keeps only what it needs: not the upgrade request, its bearer
token, or the Hello (a real aiohttp server on 127.0.0.1; aiohttp's own frames still hold the
request while the handler runs, which is theirs, not ours)."""

from __future__ import annotations

import gc
from types import CoroutineType, FrameType
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream import server as server_module
from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.session import Session
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import Ack, Hello
from gpuhealth.protocol.codec import decode_controller
from tests.support.stream import RecordingSink, agent_identity, event_frame, hello_frame

TOKEN = "tok-node-b-0123456789abcdef"
OURS = server_module.__file__.rsplit("/", 1)[0]
"""controller/stream/: every frame of our handler and of what it calls."""


def _our_code(obj: object) -> bool:
    if isinstance(obj, CoroutineType):
        return obj.cr_code.co_filename.startswith(OURS)
    if isinstance(obj, FrameType):
        return obj.f_code.co_filename.startswith(OURS)
    return False


def _handler_locals(task: Any) -> list[object]:
    """Every local of our coroutines in the handler task's await chain."""
    out: list[object] = []
    coro = task.get_coro()
    while isinstance(coro, CoroutineType):
        if _our_code(coro) and coro.cr_frame is not None:
            out.extend(coro.cr_frame.f_locals.values())
        coro = coro.cr_await
    return out


async def test_the_stream_holds_no_request_token_or_hello() -> None:
    seen: list[web.Request] = []

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request)
        return await handler(request)  # type: ignore[no-any-return]

    sink = RecordingSink()
    server = StreamServer(
        StreamServerSettings(), StaticAuthenticator({TOKEN: agent_identity("node-b")}), sink
    )
    app = web.Application(middlewares=[capture])
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = f"ws://127.0.0.1:{ts.port}/v1/stream"
            ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_bytes(hello_frame("node-b"))
            assert decode_controller((await ws.receive()).data) == Ack(seq=0)
            await ws.send_bytes(event_frame(1, "node-b"))
            assert decode_controller((await ws.receive()).data) == Ack(seq=1)
            # the stream is open and waiting for the next frame
            conn = server.connections["node-b"]
            assert not conn.ws.closed
            request = seen.pop()
            hello = sink.connects[0][1]
            sink.connects.clear()  # the test sink's own reference
            gc.collect()

            ours = [r for r in gc.get_referrers(request) if _our_code(r)]
            assert ours == [], "our handler still holds the upgrade request"
            session_state = [getattr(conn, f) for f in conn.__slots__]
            session_state += list(vars(conn.session).values())
            handler_tasks = list(server._handlers)
            assert len(handler_tasks) == 1
            held = _handler_locals(handler_tasks[0]) + session_state
            assert not any(isinstance(v, web.BaseRequest) for v in held)
            assert not any(isinstance(v, str) and TOKEN in v for v in held), "the token"
            assert not any(isinstance(v, Hello) for v in held), "the Hello"
            assert [r for r in gc.get_referrers(hello) if _our_code(r)] == []
            assert isinstance(conn.session, Session)
            await ws.close()
    finally:
        await ts.close()
