"""Slow and hoarding HTTP clients (slowloris): bounds on how long a request may take to arrive
and on how many unfinished requests one client may hold, for the controller's one listening
socket (agents' stream, API, status page, extender).

aiohttp by itself waits for a request's headers and body as long as the peer keeps the socket
open (its keep-alive timer only reaps a connection that never sends a byte, after an hour).
:class:`GuardedSite` serves the application with :class:`GuardedRequestHandler`, which

- closes a connection whose request line and headers are not complete ``http.header_timeout_s``
  after it was opened (or, kept alive, after the next request's first byte); with TLS the
  handshake has the same bound (``ssl_handshake_timeout``);
- closes a client's connection at once when that address already holds
  ``http.max_pending_per_client`` connections without a complete first request;
- closes a kept-alive connection idle for ``http.idle_timeout_s`` (aiohttp's keep-alive);
- has the kernel reap a half-open connection (its peer gone without a FIN or RST: a node that
  lost power, a partition) with TCP keepalive (``http.tcp_keepalive_*``), set on the listening
  socket so that every accepted connection inherits it: no timer, no wake-up of the event loop
  per connection, where WebSocket pings to 19,000 agents cost hundreds of sends a second;

and :meth:`ConnectionLimits.middleware` (the outermost) marks the headers complete and reads a
request's body within ``http.body_timeout_s`` (else 408 and close) and within its route's size
limit (else 413 and close) before any handler runs: ``http.max_body_bytes``, or a larger limit
the route was given (``body_limits``: the scheduler extender's). Handlers read the body with
``await request.read()``, which returns what the middleware read; the request stream itself is
consumed. Every close is counted: ``gpuhealth_http_connections_closed_total{reason}``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.http.settings import HttpSettings

log = get_logger("controller.http_limits")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionLimits:
    """The per-server state: unfinished connections per client address, the metric."""

    def __init__(
        self,
        settings: HttpSettings,
        registry: CollectorRegistry | None = None,
        *,
        body_limits: Mapping[str, int] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock or SystemClock()
        self.body_limits = dict(body_limits or {})
        """Route path → the largest body it accepts, for routes that need more (or less)
        than ``settings.max_body_bytes``."""
        self.pending: Tally[str] = Tally()
        self.closed = Counter(
            "gpuhealth_http_connections_closed",
            "HTTP connections the controller closed for being slow, too large or too many "
            "(header_timeout, body_timeout, body_too_large, too_many_pending)",
            ["reason"],
            registry=registry,
        )

    def body_limit(self, request: web.Request) -> int:
        """The largest body ``request``'s route accepts (unmatched paths: the default)."""
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else ""
        return self.body_limits.get(path, self.settings.max_body_bytes)

    def admit(self, peer: str) -> bool:
        if self.pending[peer] >= self.settings.max_pending_per_client:
            return False
        self.pending[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.pending[peer] -= 1
        if self.pending[peer] <= 0:
            del self.pending[peer]

    def cut(self, reason: str, peer: str | None, **details: object) -> None:
        self.closed.labels(reason).inc()
        log.warning("http_connection_closed", reason=reason, peer=peer, **details)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outermost: the headers are in; the body must follow within ``body_timeout_s``."""
        proto = request.protocol
        guarded = proto if isinstance(proto, GuardedRequestHandler) else None
        if guarded is not None:
            guarded.headers_complete()
        try:
            if request.body_exists:
                limit = self.body_limit(request)
                if request.client_max_size != limit:
                    request = request.clone(client_max_size=limit)
                try:
                    async with self._clock.timeout(self.settings.body_timeout_s):
                        await request.read()
                except TimeoutError:
                    self.cut("body_timeout", request.remote, path=request.path)
                    return _refusal(408, "request_timeout", "the request body was too slow")
                except web.HTTPRequestEntityTooLarge:
                    self.cut("body_too_large", request.remote, path=request.path, limit=limit)
                    return _refusal(
                        413, "request_too_large", f"the request body is larger than {limit} bytes"
                    )
            return await handler(request)
        finally:
            if guarded is not None:
                guarded.request_done()


def _refusal(status: int, error: str, message: str) -> web.Response:
    """A JSON error answered before the handler; the rest of the body is never read, so the
    connection closes after it."""
    resp = web.json_response({"error": error, "message": message}, status=status)
    resp.force_close()
    return resp


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's request handler with the header deadline and the per-client bound."""

    def __init__(self, manager: web.Server, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._peer: str | None = None
        self._pending = False
        self._in_request = True
        """From the first byte of a request until its response: no header deadline needed."""
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self._limits.admit(self._peer):
            self._limits.cut("too_many_pending", self._peer)
            self.force_close()
            return
        self._pending = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request and data:  # a kept-alive connection's next request begins
            self._in_request = True
            self._arm()
        super().data_received(data)

    def headers_complete(self) -> None:
        self._disarm()
        self._unpend()

    def request_done(self) -> None:
        self._in_request = False  # idle now: aiohttp's keep-alive timer (idle_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._unpend()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = asyncio.get_running_loop().call_later(
            self._limits.settings.header_timeout_s, self._too_slow
        )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _unpend(self) -> None:
        if self._pending and self._peer is not None:
            self._pending = False
            self._limits.release(self._peer)

    def _too_slow(self) -> None:
        self._deadline = None
        self._limits.cut("header_timeout", self._peer)
        self.force_close()


class GuardedSite(web.BaseSite):
    """A TCP site like :class:`aiohttp.web.TCPSite` whose connections are guarded."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: ConnectionLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=limits.settings.accept_batch)
        self._host = host
        self._port = port
        self._limits = limits

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        if self._server is not None and getattr(self._server, "sockets", None):
            return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        s = self._limits.settings

        def handler() -> GuardedRequestHandler:
            return GuardedRequestHandler(
                server,
                self._limits,
                loop=loop,
                keepalive_timeout=s.idle_timeout_s,
                access_log=None,
                lingering_time=0,
            )

        self._server = await loop.create_server(
            handler,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=s.header_timeout_s if self._ssl_context else None,
            reuse_address=True,
        )
        # asyncio listens with the backlog it is given and accepts as many in one turn of the
        # loop: started with ``accept_batch``, the kernel's queue is then made the larger
        # ``listen_backlog`` (listen() again on a listening socket sets its backlog; on a
        # duplicate descriptor, so the server's own socket object is left alone).
        for sock in self._server.sockets:
            with socket.socket(fileno=os.dup(sock.fileno())) as listening:
                listening.listen(s.listen_backlog)
                set_keepalive(listening, s)


def set_keepalive(sock: socket.socket, s: HttpSettings) -> None:
    """TCP keepalive on ``sock`` (Linux: inherited by the connections a listening socket
    accepts): after ``tcp_keepalive_idle_s`` without a byte either way, a probe every
    ``tcp_keepalive_interval_s``; ``tcp_keepalive_probes`` unanswered close the connection."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, s.tcp_keepalive_idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, s.tcp_keepalive_interval_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, s.tcp_keepalive_probes)
