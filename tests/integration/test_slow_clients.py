"""Slowloris against the real ``gpuhealth-controller`` process (the chart's identity, a real
API server): half a request on a real socket is closed within ``http.header_timeout_s`` while
a normal client is served; one address may hold only ``http.max_pending_per_client``
unfinished connections; a half-sent WebSocket upgrade to the agents' stream is cut too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from localkube import ControlPlane
from tests.integration.controller_helpers import Cluster, cluster, controller_process

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 1.0
MAX_PENDING = 4
MARGIN_S = 1.5
"""Scheduling slack on a loaded machine on top of the bound."""


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def closed_after(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    began = time.monotonic()
    data = b""
    async with asyncio.timeout(limit_s):
        try:
            while chunk := await reader.read(4096):
                data += chunk
        except ConnectionResetError:
            pass
    return data, time.monotonic() - began


async def half_request(port: int, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    return reader, writer


async def closed_count(base: str, reason: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/metrics") as resp:
        text = await resp.text()
    line = f'gpuhealth_http_connections_closed_total{{reason="{reason}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


async def test_half_sent_requests_are_cut_and_normal_clients_served(
    kube: Cluster, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    settings = {
        "http": {"header_timeout_s": HEADER_TIMEOUT_S, "max_pending_per_client": MAX_PENDING}
    }
    async with controller_process(kube, tmp_path, settings) as (_, base):
        port = int(base.rsplit(":", 1)[1])
        heads = [
            b"GET /api/v1/fleet HTTP/1.1\r\nHost: x\r\nX-Slow: ",  # slowloris
            b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",  # a stalled agent
        ]
        slow = [await half_request(port, h) for h in heads]
        # meanwhile a normal client is served
        async with aiohttp.ClientSession() as s, s.get(f"{base}/api/v1/fleet") as resp:
            assert resp.status == 200
        for reader, writer in slow:
            data, after = await closed_after(reader, HEADER_TIMEOUT_S + 10)
            assert data == b""
            assert after <= HEADER_TIMEOUT_S + MARGIN_S
            writer.close()
        assert await closed_count(base, "header_timeout") == len(heads)

        # one address holds at most MAX_PENDING unfinished connections; the next is refused
        held = [await half_request(port, b"GET / HTTP/1.1\r\n") for _ in range(MAX_PENDING)]
        reader, writer = await half_request(port, b"GET / HTTP/1.1\r\n")
        data, after = await closed_after(reader, HEADER_TIMEOUT_S + 10)
        assert data == b"" and after < HEADER_TIMEOUT_S  # before any deadline
        writer.close()
        for r, w in held:
            await closed_after(r, HEADER_TIMEOUT_S + 10)
            w.close()
        # served again once they are gone (the metrics are read from the same address)
        assert await closed_count(base, "too_many_pending") == 1
