"""After the handshake a stream keeps only what it needs: not the upgrade request, its bearer
token, or the Hello, and nothing of aiohttp's request handling (a real aiohttp server on
127.0.0.1): the connection is handed over to the stream's own protocol and the handler ends."""

from __future__ import annotations

import gc
import weakref
from types import FrameType
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream.agent_socket import AgentStream
from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.session import Session
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import Ack, Hello
from gpuhealth.protocol.codec import decode_controller
from tests.support.stream import RecordingSink, agent_identity, event_frame, hello_frame

TOKEN = "tok-node-b-0123456789abcdef"


def _held_by(box: list[Any]) -> list[object]:
    """What holds ``box``'s one item, other than ``box`` and running frames."""
    return [r for r in gc.get_referrers(box[0]) if r is not box and not isinstance(r, FrameType)]


async def test_the_stream_holds_no_request_token_or_hello() -> None:
    seen: list[weakref.ref[web.Request]] = []
    handlers: list[web.RequestHandler] = []  # not weakly referenceable: held here only

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
        assert isinstance(request.protocol, web.RequestHandler)
        seen.append(weakref.ref(request))
        handlers.append(request.protocol)
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
            hellos = [sink.connects[0][1]]
            sink.connects.clear()  # the test sink's own reference
            gc.collect()

            # the handler has returned and aiohttp has forgotten the connection ...
            assert list(server._handlers) == []
            assert ts.runner is not None and ts.runner.server is not None
            assert ts.runner.server.connections == []
            # ... so nothing holds the upgrade request (the token in it), its request
            # handler or the Hello any more
            assert request() is None, gc.get_referrers(request())
            assert _held_by(handlers) == []
            assert handlers[0].transport is None
            assert _held_by(hellos) == []
            held = [getattr(conn, f) for f in conn.__slots__] + list(vars(conn.session).values())
            assert not any(isinstance(v, str) and TOKEN in v for v in held), "the token"
            assert not any(isinstance(v, Hello) for v in held), "the Hello"
            assert isinstance(conn.session, Session)
            assert isinstance(conn.ws, AgentStream)
            # and the stream goes on, on its own protocol
            await ws.send_bytes(event_frame(2, "node-b"))
            assert decode_controller((await ws.receive()).data) == Ack(seq=2)
            await ws.close()
            assert ws.close_code == aiohttp.WSCloseCode.OK
        assert [e.xid for e in sink.events("node-b")] == [1, 2]
        assert "node-b" not in server.connections
        assert sink.disconnects == ["node-b"]
    finally:
        await ts.close()
