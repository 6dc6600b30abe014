"""An agent that leaves before its WebSocket upgrade is answered (a reconnect storm's timeouts)
is counted under ``gone{stage="upgrade"}``: no traceback, no 500 logged by aiohttp (a real
aiohttp server on 127.0.0.1, raw clients that reset their connection)."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import struct
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from tests.support.stream import RecordingSink, agent_identity
from tests.support.wait import until


async def test_an_agent_gone_before_the_upgrade_is_counted_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = StreamServer(
        StreamServerSettings(), StaticAuthenticator({"tok": agent_identity("n")}), RecordingSink()
    )
    app = web.Application()
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = (
        "GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Authorization: Bearer tok\r\n\r\n"
    ).encode()
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    try:
        for _ in range(40):
            _, writer = await asyncio.open_connection("127.0.0.1", ts.port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.write(upgrade)
            await writer.drain()
            writer.transport.abort()  # reset before the server reads it and answers
        await until(lambda: server.metrics.gone["upgrade"] > 0, "an upgrade found gone")
        await asyncio.sleep(0.2)
    finally:
        await ts.close()
    assert server.metrics.gone["upgrade"] >= 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


async def test_shutdown_closes_the_streams_a_bounded_number_at_a_time() -> None:
    server = StreamServer(
        StreamServerSettings(close_max_concurrent=8),
        StaticAuthenticator({}),
        RecordingSink(),
    )
    in_flight, most, closed = 0, 0, 0

    class Ws:
        async def close(self, **_: object) -> bool:
            nonlocal in_flight, most, closed
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0)  # the agent's close frame
            in_flight -= 1
            closed += 1
            return True

    for i in range(100):
        server.connections[f"n{i}"] = SimpleNamespace(ws=Ws())  # type: ignore[assignment]
    await server.close_all()
    assert closed == 100 and most == 8
