"""Slow and hoarding HTTP clients (slowloris): bounds on how long a request may take to arrive
and on how many unfinished requests one client may hold, for the controller's one listening
socket (agents' stream, API, status page, extender).

aiohttp by itself waits for a request's headers and body as long as the peer keeps the socket
open (its keep-alive timer only reaps a connection that never sends a byte, after an hour).
:class:`GuardedSite` serves the application (its runner made by :func:`app_runner`) with a
:class:`ConnectionGuard` in front of each connection's aiohttp request handler, which

- closes a connection whose request line and headers are not complete ``http.header_timeout_s``
  after it was opened (or, kept alive, after the next request's first byte); with TLS the
  handshake has the same bound (``ssl_handshake_timeout``);
- closes a client's connection at once when that address already holds
  ``http.max_pending_per_client`` connections without a complete first request;
- closes a kept-alive connection idle for ``http.idle_timeout_s`` (aiohttp's keep-alive, set
  by :func:`app_runner`);
- accepts connections itself (:class:`Acceptor`, in place of the event loop's own accept
  loop, which takes every queued connection in one turn): at most ``http.accept_batch`` per
  turn of the loop, and none while ``http.max_unready`` accepted connections still wait for
  their headers, so that in a reconnect storm the rest wait in the kernel's queue, where no
  deadline runs, instead of missing their header deadline behind the others;
- has the kernel reap a half-open connection (its peer gone without a FIN or RST: a node that
  lost power, a partition) with TCP keepalive (``http.tcp_keepalive_*``), set on the listening
  socket so that every accepted connection inherits it: no timer, no wake-up of the event loop
  per connection, where WebSocket pings to 19,000 agents cost hundreds of sends a second;

and :meth:`ConnectionLimits.middleware` (the outermost) marks the headers complete and reads a
request's body within ``http.body_timeout_s`` (else 408 and close) and within its route's size
limit (else 413 and close) before any handler runs: ``http.max_body_bytes``, or a larger limit
the route was given (``body_limits``: the scheduler extender's). Bodies come before any
authentication, so at most ``http.max_concurrent_body_reads`` are read at once: one more is
answered 503 with ``Retry-After``, unread, and its connection closed; a route may first check
its caller without reading the body (``body_checks``: the extender's client certificate).
Handlers read the body with ``await request.read()``, which returns what the middleware read;
the request stream itself is consumed. Every close is counted:
``gpuhealth_http_connections_closed_total{reason}``.

All of it with aiohttp's public API: a site (``web.BaseSite``'s ``name``, ``start`` and
``stop``), the runner's documented handler options and its ``web.Server`` as the protocol
factory, ``request.transport``; the rest is asyncio's.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
import ssl
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.http.settings import HttpSettings

log = get_logger("controller.http_limits")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyCheck = Callable[[web.Request], web.Response | None]
"""A route's check of its caller before the body is read: None, or the answer to send."""
RETRY_AFTER_S = "1"

OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""``accept()`` failures after which accepting pauses for ``http.accept_retry_s`` (as the
event loops' own accept loops do); any other failure is logged and the next turn tries again."""


class ConnectionLimits:
    """The per-server state: unfinished connections per client address, the metric."""

    def __init__(
        self,
        settings: HttpSettings,
        registry: CollectorRegistry | None = None,
        *,
        body_limits: Mapping[str, int] | None = None,
        body_checks: Mapping[str, BodyCheck] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock or SystemClock()
        self.body_limits = dict(body_limits or {})
        """Route path → the largest body it accepts, for routes that need more (or less)
        than ``settings.max_body_bytes``."""
        self.body_checks = dict(body_checks or {})
        """Route path → a check of the caller made before its body is read."""
        self.reading = 0
        """Request bodies being read now (at most ``max_concurrent_body_reads``)."""
        self.pending: Tally[str] = Tally()
        self.unready = 0
        """Accepted connections whose first request's headers are not complete yet."""
        self.on_room: Callable[[], None] | None = None
        """Told when a connection stops being unready (the acceptor resumes accepting)."""
        self.closed = Counter(
            "gpuhealth_http_connections_closed",
            "HTTP connections the controller closed for being slow, too large or too many "
            "(header_timeout, body_timeout, body_too_large, too_many_pending, "
            "too_many_body_reads)",
            ["reason"],
            registry=registry,
        )
        self.accept_paused = Counter(
            "gpuhealth_http_accept_paused",
            "Times the controller stopped accepting connections for a while (unready: "
            "http.max_unready connections still waiting for their headers; out_of_resources: "
            "no file descriptor or kernel memory left for one more)",
            ["reason"],
            registry=registry,
        )
        Gauge(
            "gpuhealth_http_connections_unready",
            "Accepted connections whose first request's headers are not complete yet",
            registry=registry,
        ).set_function(lambda: self.unready)
        Gauge(
            "gpuhealth_http_body_reads",
            "Request bodies being read now (at most http.max_concurrent_body_reads)",
            registry=registry,
        ).set_function(lambda: self.reading)

    @staticmethod
    def _route(request: web.Request) -> str:
        resource = request.match_info.route.resource
        return resource.canonical if resource is not None else ""

    def body_limit(self, request: web.Request) -> int:
        """The largest body ``request``'s route accepts (unmatched paths: the default)."""
        return self.body_limits.get(self._route(request), self.settings.max_body_bytes)

    def admit(self, peer: str) -> bool:
        if self.pending[peer] >= self.settings.max_pending_per_client:
            return False
        self.pending[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.pending[peer] -= 1
        if self.pending[peer] <= 0:
            del self.pending[peer]

    def accepted(self) -> Unready:
        """One more connection accepted, unready until its headers are in or it closes."""
        self.unready += 1
        return Unready(self)

    def settled(self) -> None:
        self.unready -= 1
        if self.on_room is not None:
            self.on_room()

    def cut(self, reason: str, peer: str | None, **details: object) -> None:
        self.closed.labels(reason).inc()
        log.warning("http_connection_closed", reason=reason, peer=peer, **details)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outermost: the headers are in; the body must follow within ``body_timeout_s``."""
        guarded = ConnectionGuard.of(request)
        if guarded is not None:
            guarded.headers_complete()
        try:
            if request.body_exists:
                check = self.body_checks.get(self._route(request))
                refused = check(request) if check is not None else None
                if refused is not None:
                    refused.force_close()  # its body is never read
                    return refused
                request, refused = await self._read_body(request)
                if refused is not None:
                    return refused
            return await handler(request)
        finally:
            if guarded is not None:
                guarded.request_done()

    async def _read_body(self, request: web.Request) -> tuple[web.Request, web.Response | None]:
        """Read the body: the request whose ``read()`` returns it to the handler, and the
        refusal when it was not read."""
        if self.reading >= self.settings.max_concurrent_body_reads:
            self.cut("too_many_body_reads", request.remote, path=request.path)
            refusal = _refusal(
                503, "too_many_body_reads", "too many request bodies are being read; retry"
            )
            refusal.headers["Retry-After"] = RETRY_AFTER_S
            return request, refusal
        limit = self.body_limit(request)
        if request.client_max_size != limit:
            request = request.clone(client_max_size=limit)
        self.reading += 1
        try:
            async with self._clock.timeout(self.settings.body_timeout_s):
                await request.read()
        except TimeoutError:
            self.cut("body_timeout", request.remote, path=request.path)
            return request, _refusal(408, "request_timeout", "the request body was too slow")
        except web.HTTPRequestEntityTooLarge:
            self.cut("body_too_large", request.remote, path=request.path, limit=limit)
            return request, _refusal(
                413, "request_too_large", f"the request body is larger than {limit} bytes"
            )
        finally:
            self.reading -= 1
        return request, None


def _refusal(status: int, error: str, message: str) -> web.Response:
    """A JSON error answered before the handler; the rest of the body is never read, so the
    connection closes after it."""
    resp = web.json_response({"error": error, "message": message}, status=status)
    resp.force_close()
    return resp


class Unready:
    """An accepted connection not yet past its first request's headers: counted in
    :attr:`ConnectionLimits.unready` until released, once (headers complete, the connection
    closed, or its TLS handshake failed)."""

    __slots__ = ("_limits",)

    def __init__(self, limits: ConnectionLimits) -> None:
        self._limits: ConnectionLimits | None = limits

    def release(self) -> None:
        limits, self._limits = self._limits, None
        if limits is not None:
            limits.settled()


class ConnectionGuard(asyncio.Protocol):
    """One accepted connection in front of aiohttp's request handler: the header deadline and
    the per-client bound; every protocol event passed on to the handler.

    The handler comes from the runner's ``web.Server``, aiohttp's documented protocol factory,
    with the runner's options (:func:`app_runner`); a connection over the per-client bound is
    closed before aiohttp sees it. The guard is the transport's protocol, which is how
    :meth:`ConnectionLimits.middleware` finds it (:meth:`of`); a WebSocket handed over to a
    protocol of its own (``stream/agent_socket.py``) leaves it behind."""

    __slots__ = (
        "_deadline",
        "_handler",
        "_in_request",
        "_limits",
        "_peer",
        "_pending",
        "_server",
        "_transport",
        "_unready",
    )

    def __init__(
        self, server: web.Server, limits: ConnectionLimits, unready: Unready | None = None
    ) -> None:
        self._server = server
        self._limits = limits
        self._unready = unready
        self._handler: web.RequestHandler | None = None
        """aiohttp's, once the connection is admitted."""
        self._transport: asyncio.BaseTransport | None = None
        self._peer: str | None = None
        self._pending = False
        self._in_request = True
        """From the first byte of a request until its response: no header deadline needed."""
        self._deadline: asyncio.TimerHandle | None = None

    @staticmethod
    def of(request: web.BaseRequest) -> ConnectionGuard | None:
        """The guard of ``request``'s connection (None: not served by a :class:`GuardedSite`,
        or gone)."""
        transport = request.transport
        guard = None if transport is None else transport.get_protocol()
        return guard if isinstance(guard, ConnectionGuard) else None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self._limits.admit(self._peer):
            self._limits.cut("too_many_pending", self._peer)
            transport.close()
            return
        self._pending = True
        self._handler = self._server()
        self._handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request and data:  # a kept-alive connection's next request begins
            self._in_request = True
            self._arm()
        if self._handler is not None:
            self._handler.data_received(data)

    def eof_received(self) -> None:  # (aiohttp's handler keeps nothing open: the transport closes)
        if self._handler is not None:
            self._handler.eof_received()

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._unpend()
        handler, self._handler, self._transport = self._handler, None, None
        if handler is not None:
            handler.connection_lost(exc)

    # -- the request's progress (ConnectionLimits.middleware) --------------------------------

    def headers_complete(self) -> None:
        self._disarm()
        self._unpend()

    def request_done(self) -> None:
        self._in_request = False  # idle now: aiohttp's keep-alive timer (idle_timeout_s)

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
        """No longer waiting for a first request: its address's count, and (once) the
        acceptor's count of unready connections."""
        if self._pending and self._peer is not None:
            self._pending = False
            self._limits.release(self._peer)
        if self._unready is not None:
            self._unready.release()
            self._unready = None

    def _too_slow(self) -> None:
        self._deadline = None
        self._limits.cut("header_timeout", self._peer)
        if self._transport is not None:
            self._transport.close()


class Acceptor:
    """Accepts a site's connections on its listening sockets, paced (see the module docstring).

    Stands where the event loop's server object would (``sockets``, ``close``) and works the
    same on asyncio's loop and on uvloop: a reader callback per listening socket accepts up to
    ``accept_batch`` connections a turn, each then made a transport by the loop's
    ``connect_accepted_socket`` (with TLS, the handshake there, bound by ``header_timeout_s``)."""

    def __init__(
        self,
        sockets: list[socket.socket],
        factory: Callable[[Unready], asyncio.Protocol],
        limits: ConnectionLimits,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sockets = tuple(sockets)
        self._factory = factory
        self._limits = limits
        self._ssl = ssl_context
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task[None]] = set()
        limits.on_room = self._room

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._closed else self._sockets

    def start(self) -> None:
        self._read(on=True)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (open connections are the web
        server's to close); connections still in their TLS handshake are dropped."""
        if self._closed:
            return
        self._read(on=False)
        self._closed = True
        self._limits.on_room = None
        if self._retry is not None:
            self._retry.cancel()
        for task in self._connecting:
            task.cancel()
        for sock in self._sockets:
            sock.close()

    def _read(self, *, on: bool) -> None:
        if on == self._reading or self._closed:
            return
        self._reading = on
        for sock in self._sockets:
            if on:
                self._loop.add_reader(sock.fileno(), self._accept, sock)
            else:
                self._loop.remove_reader(sock.fileno())

    def _room(self) -> None:
        if self._retry is None and self._limits.unready < self._limits.settings.max_unready:
            self._read(on=True)

    def _resume(self) -> None:
        self._retry = None
        self._room()

    def _accept(self, sock: socket.socket) -> None:
        s = self._limits.settings
        for _ in range(min(s.accept_batch, s.max_unready - self._limits.unready)):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # reset while it waited in the queue
            except OSError as exc:
                log.error("http_accept_failed", error=str(exc), errno=exc.errno)
                if exc.errno in OUT_OF_RESOURCES:
                    self._limits.accept_paused.labels("out_of_resources").inc()
                    self._read(on=False)
                    self._retry = self._loop.call_later(s.accept_retry_s, self._resume)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn, self._limits.accepted()))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        if self._limits.unready >= s.max_unready:
            self._limits.accept_paused.labels("unready").inc()
            self._read(on=False)

    async def _connect(self, conn: socket.socket, unready: Unready) -> None:
        made = False
        try:
            await self._loop.connect_accepted_socket(
                lambda: self._factory(unready),
                conn,
                ssl=self._ssl,
                ssl_handshake_timeout=(
                    self._limits.settings.header_timeout_s if self._ssl is not None else None
                ),
            )
            made = True
        except (OSError, TimeoutError) as exc:  # a TLS handshake failed or too slow, peer gone
            log.debug("http_connection_not_made", error=repr(exc))
        except Exception:
            log.exception("http_connection_not_made")
        finally:
            if not made:  # also when cancelled (the site closing)
                conn.close()
                unready.release()


def app_runner(
    app: web.Application, settings: HttpSettings, *, shutdown_timeout: float = 60.0
) -> web.AppRunner:
    """The runner a :class:`GuardedSite` serves: aiohttp's request handlers (its documented
    options) closing a kept-alive connection idle for ``idle_timeout_s``, reading nothing of a
    refused body after its answer (``lingering_time`` 0), logging no access."""
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=settings.idle_timeout_s,
        lingering_time=0,
        shutdown_timeout=shutdown_timeout,
    )


class GuardedSite(web.BaseSite):
    """A TCP site like :class:`aiohttp.web.TCPSite` whose connections are guarded
    (:class:`ConnectionGuard`) and whose accepts are paced (:class:`Acceptor`); its runner is
    made by :func:`app_runner`. Registered with the runner like any site: the runner's
    ``cleanup()`` stops it."""

    __slots__ = ("_acceptor", "_limits", "_listen_host", "_listen_port", "_served", "_tls")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: ConnectionLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner)
        self._served = runner
        self._listen_host = host
        self._listen_port = port
        self._limits = limits
        self._tls = ssl_context
        self._acceptor: Acceptor | None = None

    @property
    def name(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self._listen_host}:{self.port}"

    @property
    def port(self) -> int:
        if self._acceptor is not None and self._acceptor.sockets:
            return int(self._acceptor.sockets[0].getsockname()[1])
        return self._listen_port

    async def start(self) -> None:
        await super().start()
        server = self._served.server
        assert server is not None
        limits = self._limits

        def guard(unready: Unready) -> ConnectionGuard:
            return ConnectionGuard(server, limits, unready)

        sockets = await _listen(
            self._listen_host, self._listen_port, limits.settings.listen_backlog, limits.settings
        )
        self._acceptor = Acceptor(sockets, guard, limits, self._tls)
        self._acceptor.start()

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        await super().stop()


async def _listen(host: str, port: int, backlog: int, s: HttpSettings) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as ``loop.create_server`` binds
    them: ``SO_REUSEADDR``, IPv6 sockets IPv6 only), with TCP keepalive set for the
    connections they accept."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
            set_keepalive(sock, s)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


OPEN_FILES_UNLIMITED = 1 << 20
"""The soft limit asked for under an unlimited hard one: Linux's default ``fs.nr_open``, the
most a process may hold."""


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; returns the limit now.

    Every agent's stream is a descriptor. A container can start with a soft limit of 1,024
    under a far higher hard one (systemd's default, 1,024:524,288, where the runtime passes it
    on; Go programs raise their own soft limit, CPython does not), which would stop the
    controller near 1,000 agents (each accept past it fails with ``EMFILE``, counted in
    ``gpuhealth_http_accept_paused_total{reason="out_of_resources"}``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft in (resource.RLIM_INFINITY, hard):
        return soft
    # an unlimited hard limit still stops at the kernel's fs.nr_open (2**20 by default)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_UNLIMITED)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=str(exc))
        return soft
    return wanted


def set_keepalive(sock: socket.socket, s: HttpSettings) -> None:
    """TCP keepalive on ``sock`` (Linux: inherited by the connections a listening socket
    accepts): after ``tcp_keepalive_idle_s`` without a byte either way, a probe every
    ``tcp_keepalive_interval_s``; ``tcp_keepalive_probes`` unanswered close the connection."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, s.tcp_keepalive_idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, s.tcp_keepalive_interval_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, s.tcp_keepalive_probes)
