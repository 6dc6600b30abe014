"""Slow and hoarding clients on a real loopback socket (controller/http/limits.py): half a
request is cut at the header deadline, a slow body gets 408, one address may hold only so
many unfinished connections, and a normal client is served meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import resource
import socket
import ssl
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
import trustme
import uvloop
from aiohttp import web

from gpuhealth.controller.http.limits import (
    Acceptor,
    ConnectionGuard,
    ConnectionLimits,
    GuardedSite,
    Unready,
    app_runner,
    raise_open_files_limit,
)
from gpuhealth.controller.http.settings import HttpSettings
from tests.support.wait import until

SETTINGS = HttpSettings(
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    idle_timeout_s=5.0,
    max_pending_per_client=3,
    max_body_bytes=1024,
)
STORM = 200
"""Connections opened at once against a busy loop (above aiohttp's default backlog, 128)."""
BIG_ROUTE_BYTES = 4096
"""The body limit of ``/big/{name}`` (as the extender's routes have their own)."""


async def echo(req: web.Request) -> web.Response:
    return web.json_response({"got": len(await req.read())})


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, ConnectionLimits]]:
    limits = ConnectionLimits(SETTINGS, None, body_limits={"/big/{name}": BIG_ROUTE_BYTES})
    app = web.Application(client_max_size=SETTINGS.max_body_bytes, middlewares=[limits.middleware])
    app.router.add_route("*", "/echo", echo)
    app.router.add_post("/big/{name}", echo)
    runner = app_runner(app, limits.settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    try:
        yield site.port, limits
    finally:
        await runner.cleanup()


def closed(limits: ConnectionLimits, reason: str) -> float:
    return limits.closed.labels(reason)._value.get()


async def closed_within(reader: asyncio.StreamReader, bound_s: float) -> tuple[bytes, float]:
    """What the server sent before closing, and after how long (EOF or reset)."""
    began = time.monotonic()
    data = b""
    async with asyncio.timeout(bound_s):
        try:
            while chunk := await reader.read(4096):
                data += chunk
        except ConnectionResetError:
            pass
    return data, time.monotonic() - began


async def get_ok(port: int) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/echo") as r:
        assert r.status == 200


async def test_half_sent_headers_are_cut_at_the_deadline(
    server: tuple[int, ConnectionLimits],
) -> None:
    port, limits = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()
    await get_ok(port)  # a normal client meanwhile
    data, after = await closed_within(reader, 5.0)
    assert data == b"" and after < 1.5
    assert closed(limits, "header_timeout") == 1
    assert not limits.pending
    writer.close()


async def test_trickled_headers_do_not_extend_the_deadline(
    server: tuple[int, ConnectionLimits],
) -> None:
    port, limits = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()

    async def trickle() -> None:
        for b in b"GET /echo HTTP/1.1\r\nHost: x\r\n":
            writer.write(bytes([b]))
            await writer.drain()
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    await closed_within(reader, 5.0)
    assert time.monotonic() - began < 1.5
    task.cancel()
    assert closed(limits, "header_timeout") == 1
    writer.close()


async def test_a_slow_body_gets_408(server: tuple[int, ConnectionLimits]) -> None:
    port, limits = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhalf")
    await writer.drain()
    data, after = await closed_within(reader, 5.0)
    assert data.startswith(b"HTTP/1.1 408") and after < 1.5
    assert closed(limits, "body_timeout") == 1
    writer.close()


async def test_a_kept_alive_connection_gets_a_new_deadline_per_request(
    server: tuple[int, ConnectionLimits],
) -> None:
    port, limits = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await reader.readexactly(len(b'{"got": 0}'))
    await asyncio.sleep(0.8)  # idle longer than the header deadline: allowed (idle_timeout_s)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")  # then half a second request
    await writer.drain()
    began = time.monotonic()
    data, _ = await closed_within(reader, 5.0)
    assert data == b"" and time.monotonic() - began < 1.5
    assert closed(limits, "header_timeout") == 1
    writer.close()


async def test_a_kept_alive_connection_idle_past_idle_timeout_is_closed() -> None:
    """Between requests a connection has no header deadline (the middleware found its guard
    and told it the request was done), only the idle timeout ``app_runner`` gave aiohttp."""
    settings = HttpSettings(header_timeout_s=0.2, idle_timeout_s=0.6)
    limits = ConnectionLimits(settings, None)
    app = web.Application(middlewares=[limits.middleware])
    app.router.add_get("/echo", echo)
    runner = app_runner(app, settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        for _ in range(2):  # idle past the header deadline between them: still served
            writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await reader.readexactly(len(b'{"got": 0}'))
            idle_since = time.monotonic()
            await asyncio.sleep(0.35)
        data, _ = await closed_within(reader, 5.0)
        assert data == b""
        assert 0.5 < time.monotonic() - idle_since < 1.5  # idle_timeout_s, not aiohttp's hour
        assert closed(limits, "header_timeout") == 0
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_refused_connection_never_reaches_aiohttp(
    server: tuple[int, ConnectionLimits], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``max_pending_per_client`` the guard closes the connection itself: no aiohttp
    request handler is made for it."""
    port, limits = server
    made: list[web.RequestHandler] = []
    make = web.Server.__call__

    def counted(self: web.Server) -> web.RequestHandler:
        made.append(make(self))
        return made[-1]

    monkeypatch.setattr(web.Server, "__call__", counted)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    await until(lambda: sum(limits.pending.values()) == 3, "three connections admitted")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data, _ = await closed_within(reader, 1.0)
    assert data == b"" and closed(limits, "too_many_pending") == 1
    assert len(made) == 3
    for _, w in [*held, (reader, writer)]:
        w.close()


async def test_one_address_may_hold_only_so_many_unfinished_connections(
    server: tuple[int, ConnectionLimits],
) -> None:
    port, limits = server
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for _, w in held:
        w.write(b"GET /echo HTTP/1.1\r\n")
        await w.drain()
    await asyncio.sleep(0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data, _ = await closed_within(reader, 0.4)  # refused before any deadline
    assert data == b""
    assert closed(limits, "too_many_pending") >= 1
    for r, w in held:
        await closed_within(r, 5.0)
        w.close()
    writer.close()
    await get_ok(port)  # the address is welcome again


async def post(port: int, path: str, size: int) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}{path}", data=b"x" * size) as r,
    ):
        return r.status, await r.json()


async def test_handlers_read_the_body_the_middleware_read(
    server: tuple[int, ConnectionLimits],
) -> None:
    port, _ = server
    assert await post(port, "/echo", SETTINGS.max_body_bytes) == (200, {"got": 1024})
    assert await post(port, "/big/x", BIG_ROUTE_BYTES) == (200, {"got": BIG_ROUTE_BYTES})


@pytest.mark.parametrize(
    ("path", "limit"), [("/echo", SETTINGS.max_body_bytes), ("/big/y", BIG_ROUTE_BYTES)]
)
async def test_a_body_over_its_routes_limit_gets_413_and_is_counted(
    server: tuple[int, ConnectionLimits], path: str, limit: int
) -> None:
    port, limits = server
    status, doc = await post(port, path, limit + 1)
    assert status == 413
    assert doc == {
        "error": "request_too_large",
        "message": f"the request body is larger than {limit} bytes",
    }
    assert closed(limits, "body_too_large") == 1
    await get_ok(port)  # served normally afterwards


@pytest.mark.parametrize("backlog", [16, 4096])
async def test_the_listen_backlog_queues_a_storm_while_the_loop_is_busy(backlog: int) -> None:
    """Connections the kernel completes while the event loop accepts none (a reconnect storm):
    the site's backlog, not aiohttp's default 128, bounds them."""
    limits = ConnectionLimits(HttpSettings(listen_backlog=backlog), None)
    runner = app_runner(web.Application(), limits.settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    port = site.port

    def connect() -> socket.socket | None:
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
            return s
        except OSError:
            s.close()
            return None

    try:
        with ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(connect) for _ in range(STORM)]
            time.sleep(1.0)  # the event loop is held: nothing is accepted meanwhile
            socks = [f.result() for f in futures]
        done = [s for s in socks if s is not None]
        for s in done:
            s.close()
    finally:
        await runner.cleanup()
    # The kernel queues up to backlog + 1 (aiohttp's default, 128, would stop at 129). A few
    # more may see their connect succeed: SYNs answered while the queue still had room, whose
    # last ACK then finds it full (the client cannot tell), so the bound has some slack.
    if backlog + 1 >= STORM:
        assert len(done) == STORM
    else:
        assert backlog + 1 <= len(done) < 2 * backlog


async def test_a_storm_is_accepted_a_batch_per_turn_of_the_loop() -> None:
    """However many connections the kernel queued, one turn of the event loop accepts at most
    ``accept_batch`` of them: the turns stay short (a Lease renewal is never stuck behind a
    storm's accepts), while the kernel still queues up to ``listen_backlog``."""
    settings = HttpSettings(listen_backlog=4096, accept_batch=16, max_pending_per_client=100_000)
    limits = ConnectionLimits(settings, None)
    runner = app_runner(web.Application(), settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    port = site.port
    loop = asyncio.get_running_loop()
    made: list[int] = []

    def tick() -> None:  # runs once per turn of the loop
        made.append(sum(limits.pending.values()))
        if made[-1] < STORM:
            loop.call_soon(tick)

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=2.0)

    try:
        with ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(connect) for _ in range(STORM)]
            # waiting here holds the event loop: the kernel queues them all, none is accepted
            socks = [f.result() for f in futures]
        loop.call_soon(tick)
        await asyncio.wait_for(until_accepted(made), 10)
        per_turn = [b - a for a, b in itertools.pairwise(made)]
        assert made[-1] == STORM
        assert max(per_turn) <= 16
        assert sum(1 for n in per_turn if n) >= STORM // 16
        for s in socks:
            s.close()
    finally:
        await runner.cleanup()


async def until_accepted(made: list[int]) -> None:
    while not made or made[-1] < STORM:
        await asyncio.sleep(0.01)


async def test_every_accepted_connection_has_tcp_keepalive_as_configured() -> None:
    """Half-open connections (a node gone without closing its socket) are the kernel's to
    reap: every connection the site accepts, read from inside a handler, carries the
    configured keepalive, inherited from the listening socket."""
    settings = HttpSettings(
        tcp_keepalive_idle_s=7, tcp_keepalive_interval_s=3, tcp_keepalive_probes=4
    )

    async def options(req: web.Request) -> web.Response:
        assert req.transport is not None
        sock = req.transport.get_extra_info("socket")
        return web.json_response(
            [
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            ]
        )

    app = web.Application()
    app.router.add_get("/options", options)
    runner = app_runner(app, settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, ConnectionLimits(settings, None))
    await site.start()
    try:
        for _ in range(3):  # each a new connection
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
                s.get(f"http://127.0.0.1:{site.port}/options") as r,
            ):
                assert await r.json() == [1, 7, 3, 4]
    finally:
        await runner.cleanup()


# -- the acceptor: accepts paced by connections still waiting for their headers ----------------


async def _echo_site(
    settings: HttpSettings, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, GuardedSite, ConnectionLimits]:
    """A started site serving ``/echo`` behind the limits' middleware."""
    limits = ConnectionLimits(settings, None)
    app = web.Application(middlewares=[limits.middleware])
    app.router.add_get("/echo", echo)
    runner = app_runner(app, limits.settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits, ssl_context=ssl_context)
    await site.start()
    return runner, site, limits


async def _prompt_clients_storm() -> tuple[int, float, float, int]:
    """``STORM`` clients connect at once, each sending its request at once, to a site that
    lets only 4 connections wait for their headers: (most unready seen in any turn of the
    loop, header timeouts, pauses for room, answered)."""
    runner, site, limits = await _echo_site(
        HttpSettings(
            header_timeout_s=2.0, max_unready=4, accept_batch=64, max_pending_per_client=100_000
        )
    )
    loop = asyncio.get_running_loop()
    seen: list[int] = []
    done = False

    def tick() -> None:  # once per turn of the loop
        seen.append(limits.unready)
        if not done:
            loop.call_soon(tick)

    async def client() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        return int(answer.startswith(b"HTTP/1.1 200"))

    try:
        loop.call_soon(tick)
        answered = sum(
            await asyncio.wait_for(asyncio.gather(*(client() for _ in range(STORM))), 30)
        )
        done = True
        assert limits.unready == 0 and not limits.pending
        return (
            max(seen),
            closed(limits, "header_timeout"),
            limits.accept_paused.labels("unready")._value.get(),
            answered,
        )
    finally:
        done = True
        await runner.cleanup()


async def test_no_more_connections_wait_for_their_headers_than_max_unready() -> None:
    """A storm of clients against ``max_unready`` = 4: never more than 4 accepted connections
    wait for their headers, the rest wait in the kernel's queue (no deadline runs there), and
    every client is answered without one header deadline missed."""
    most, timeouts, paused, answered = await _prompt_clients_storm()
    assert answered == STORM
    assert most <= 4
    assert timeouts == 0
    assert paused > 0  # it did stop accepting for want of room


def test_uvloop_is_paced_the_same() -> None:
    """uvloop accepts every queued connection in one turn by itself; through the acceptor it
    is held to the same bound."""
    most, timeouts, paused, answered = uvloop.run(_prompt_clients_storm())
    assert (answered, timeouts) == (STORM, 0)
    assert most <= 4 and paused > 0


async def test_silent_connections_hold_the_room_only_until_their_deadline() -> None:
    """Clients that connect and send nothing fill ``max_unready``; a prompt client queued
    behind them is served once their header deadline frees the room."""
    runner, site, limits = await _echo_site(
        HttpSettings(header_timeout_s=0.3, max_unready=3, max_pending_per_client=100)
    )
    try:
        connected = time.monotonic()  # the silent ones' deadlines start after this
        silent = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(3)]
        await until(lambda: limits.unready == 3, "the silent connections to be accepted")
        await get_ok(site.port)
        # it waited for the silent ones' header deadline (0.3 s after they were accepted)
        assert time.monotonic() - connected >= 0.3
        assert closed(limits, "header_timeout") == 3
        for _, writer in silent:
            writer.close()
    finally:
        await runner.cleanup()
    assert limits.unready == 0


class _FailingOnce:
    """A listening socket whose first ``accept`` fails with ``error``."""

    def __init__(self, sock: socket.socket, error: int) -> None:
        self._sock = sock
        self._error: int | None = error

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self) -> tuple[socket.socket, object]:
        if self._error is not None:
            error, self._error = self._error, None
            raise OSError(error, os.strerror(error))
        return self._sock.accept()

    def close(self) -> None:
        self._sock.close()


@pytest.mark.parametrize(("error", "paused"), [(errno.EMFILE, 1.0), (errno.EPROTO, 0.0)])
async def test_accepting_pauses_when_out_of_descriptors(error: int, paused: float) -> None:
    """Out of file descriptors: accepting stops for ``accept_retry_s`` (the connection waits
    in the kernel's queue, counted), then the connection is served; another failure is
    logged and the next turn tries again."""
    settings = HttpSettings(accept_retry_s=0.3)
    limits = ConnectionLimits(settings, None)
    app = web.Application(middlewares=[limits.middleware])
    app.router.add_get("/echo", echo)
    runner = app_runner(app, limits.settings)
    await runner.setup()
    assert runner.server is not None
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    server = runner.server

    def guard(unready: Unready) -> ConnectionGuard:
        return ConnectionGuard(server, limits, unready)

    acceptor = Acceptor([_FailingOnce(sock, error)], guard, limits, None)  # type: ignore[list-item]
    acceptor.start()
    try:
        began = time.monotonic()
        await get_ok(port)
        took = time.monotonic() - began
        assert limits.accept_paused.labels("out_of_resources")._value.get() == paused
        assert (took >= 0.25) == bool(paused)
    finally:
        acceptor.close()
        await runner.cleanup()
    assert not acceptor.sockets and sock.fileno() == -1


async def _tls_handshake_failure() -> None:
    """A client that is not TLS at all on a TLS site: its handshake fails, the connection is
    closed, and it no longer counts as waiting for headers; a TLS client is then served."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    runner, site, limits = await _echo_site(HttpSettings(max_unready=1), ctx)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await closed_within(reader, 5.0)
        writer.close()
        for _ in range(100):
            if limits.unready == 0:
                break
            await asyncio.sleep(0.01)
        assert limits.unready == 0
        client = ssl.create_default_context()
        ca.configure_trust(client)
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"https://localhost:{site.port}/echo", ssl=client) as r,
        ):
            assert r.status == 200  # served: the room is free again
    finally:
        await runner.cleanup()


async def test_a_failed_tls_handshake_frees_its_room() -> None:
    await _tls_handshake_failure()


def test_a_failed_tls_handshake_frees_its_room_on_uvloop() -> None:
    uvloop.run(_tls_handshake_failure())


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    """Started with a soft limit of 1,024 under a higher hard one (systemd's default, which a
    container may inherit), the controller would stop near 1,000 agents: it raises the soft
    limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 1024, "the test needs a hard limit above 1024"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        now = raise_open_files_limit()
        assert now > 1024
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (now, hard)
        assert raise_open_files_limit() == now  # already raised: unchanged
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        ((1024, 4096), (4096, 4096)),
        ((4096, 4096), (4096, 4096)),
        ((1024, resource.RLIM_INFINITY), (1 << 20, resource.RLIM_INFINITY)),
        ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), None),
    ],
)
def test_the_soft_limit_asked_for(
    start: tuple[int, int], expected: tuple[int, int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised to the hard limit; under an unlimited hard one to the kernel's default most; an
    unlimited soft limit is never lowered."""
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: start)
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: asked.append(limits))
    now = raise_open_files_limit()
    if expected is None or expected == start:
        assert asked == [] and now == start[0]
    else:
        assert asked == [expected] and now == expected[0]


@contextlib.asynccontextmanager
async def echo_site(limits: ConnectionLimits) -> AsyncIterator[int]:
    """``/echo`` behind ``limits``' middleware on a guarded site; its port."""
    app = web.Application(client_max_size=1024, middlewares=[limits.middleware])
    app.router.add_route("*", "/echo", echo)
    runner = app_runner(app, limits.settings)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits)
    await site.start()
    try:
        yield site.port
    finally:
        await runner.cleanup()


async def test_bodies_read_at_once_are_bounded_and_the_rest_answered_503() -> None:
    """Bodies are read before any authentication: two half-sent bodies hold the bound, a
    third is answered 503 with Retry-After without its body read (counted, the connection
    closed); requests without a body are served meanwhile; once the two finish, bodies are
    read again."""
    settings = HttpSettings(body_timeout_s=5.0, max_concurrent_body_reads=2, max_body_bytes=1024)
    limits = ConnectionLimits(settings, None)
    async with echo_site(limits) as port:
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf")
            await writer.drain()
            held.append((reader, writer))
        await until(lambda: limits.reading == 2, "two bodies being read")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
        data, _after = await closed_within(reader, 5.0)
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 503") and b"retry-after: 1" in head
        assert closed(limits, "too_many_body_reads") == 1
        writer.close()
        await get_ok(port)  # no body: not bounded
        for reader, writer in held:
            writer.write(b"it all")  # the rest of the 10 bytes
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
            writer.close()
        await until(lambda: limits.reading == 0, "the bodies read")
        assert await post(port, "/echo", 10) == (200, {"got": 10})


async def test_a_route_checks_its_caller_before_the_body_is_read() -> None:
    """``body_checks``: a refused caller's body is never read (the extender's client
    certificate)."""
    settings = HttpSettings(max_body_bytes=1024)
    seen: list[str] = []

    def check(request: web.Request) -> web.Response | None:
        seen.append(request.path)
        if request.headers.get("X-Ok"):
            return None
        return web.json_response({"error": "no"}, status=401)

    limits = ConnectionLimits(settings, None, body_checks={"/echo": check})
    async with echo_site(limits) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        await writer.drain()  # the body never comes: refused on the headers alone
        data, after = await closed_within(reader, 5.0)
        assert data.startswith(b"HTTP/1.1 401") and after < 1.0 and limits.reading == 0
        writer.close()
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://127.0.0.1:{port}/echo", data=b"x" * 10, headers={"X-Ok": "1"}) as r,
        ):
            assert r.status == 200 and await r.json() == {"got": 10}
        assert seen == ["/echo", "/echo"]
