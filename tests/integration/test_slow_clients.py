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


FLOOD_CLIENTS = 96
"""Concurrent unauthenticated senders, each from its own loopback address (any pod)."""
MiB = 1 << 20


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set size of process ``pid`` (``VmRSS``, ``VmHWM``)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def filter_body(size: int) -> bytes:
    """An ExtenderArgs of about ``size`` bytes: node names only, as nodeCacheCapable sends
    (the most objects per byte to decode)."""
    names = [f'"gpu-{i:07d}"' for i in range(size // 14)]
    return (
        b'{"Pod":{"metadata":{"name":"p","namespace":"x"}},"NodeNames":['
        + ",".join(names).encode()
        + b"]}"
    )


async def post_body(port: int, source: str, body: bytes) -> int:
    """POST ``body`` to the extender's filter from ``source``; the HTTP status, or 0 when the
    controller closed the connection before answering."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        return 0
    head = (
        f"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        writer.write(head)
        for at in range(0, len(body), 256 << 10):
            writer.write(body[at : at + (256 << 10)])
            await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 60)
    except (ConnectionError, TimeoutError):
        line = b""
    finally:
        writer.close()
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 else 0


async def test_a_flood_of_large_unauthenticated_bodies_keeps_the_leaders_memory_bounded(
    kube: Cluster, tmp_path: Path
) -> None:
    """96 senders, each from its own address, post a 3.5 MiB extender body at once to the
    real controller process with its defaults (``extender.max_body_bytes`` 4 MiB,
    ``http.max_concurrent_body_reads`` 8): those over the bound get 503 with Retry-After
    without their body read (counted), the others are answered, and the process's peak RSS
    grows by a bounded amount. Unbounded (32 MiB bodies read at any concurrency, before any
    authentication) the same flood made the process hold every body at once."""
    body = filter_body(int(3.5 * MiB))
    async with controller_process(kube, tmp_path) as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        for _ in range(2):  # warm-up: every code path of a large body has run once
            assert await post_body(port, "127.0.0.1", body) == 200
        rss_before, peak_before = rss_mib(proc.pid)
        statuses = await asyncio.gather(
            *(post_body(port, f"127.0.1.{i + 1}", body) for i in range(FLOOD_CLIENTS))
        )
        rss_after, peak_after = rss_mib(proc.pid)
        refused = await closed_count(base, "too_many_body_reads")
        async with aiohttp.ClientSession() as s, s.get(f"{base}/readyz/replica") as resp:
            assert resp.status == 200  # the leader serves on
    answered = statuses.count(200)
    growth = peak_after - peak_before
    print(
        f"\nextender flood: {FLOOD_CLIENTS} x {len(body) / MiB:.1f} MiB: {answered} answered, "
        f"{statuses.count(503)} refused 503, {statuses.count(0)} cut; RSS {rss_before:.0f} -> "
        f"{rss_after:.0f} MiB, peak {peak_before:.0f} -> {peak_after:.0f} MiB (+{growth:.0f})"
    )
    assert set(statuses) <= {200, 503, 0}
    assert answered >= 8 and statuses.count(503) > 0 and refused == statuses.count(503)
    # 8 bodies of 4 MiB read at once, each decoded one at a time: well under this
    assert growth < FLOOD_BOUND_MIB, f"peak RSS grew {growth:.0f} MiB"
    assert growth < FLOOD_CLIENTS * len(body) / MiB / 3  # far from every body at once


FLOOD_BOUND_MIB = 160
"""Peak RSS growth allowed: 8 concurrent bodies of 4 MiB (read, then copied once) and one
decoded at a time (~350,000 node names), with margin for the allocator."""
