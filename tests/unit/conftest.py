"""Fixtures shared by the unit tests (builders and fakes live in tests/support/)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream.server import StreamServer
from tests.support.stream import ServeStream


@pytest.fixture
async def serve_stream() -> AsyncIterator[ServeStream]:
    """Serve a ``StreamServer``'s routes on 127.0.0.1 until the test ends: its ws:// URL."""
    servers: list[TestServer] = []

    async def serve(server: StreamServer) -> str:
        app = web.Application()
        server.add_routes(app)
        ts = TestServer(app, host="127.0.0.1", port=0)
        await ts.start_server()
        servers.append(ts)
        return f"ws://127.0.0.1:{ts.port}/v1/stream"

    yield serve
    for ts in servers:
        await ts.close()
