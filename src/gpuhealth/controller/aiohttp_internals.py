"""The aiohttp internals the controller relies on: every one of them is here, and only here.

The rest of the controller uses aiohttp's public API. What is here serves two purposes, each
measured, neither possible with the public API; each seam has a canary in
``tests/unit/controller/test_aiohttp_internals.py`` that fails naming it when an aiohttp
upgrade removes or reshapes it (aiohttp is pinned to the minor version they were checked
against, ``pyproject.toml``).

**The agent stream's hand-over** (:class:`DetachableWebSocket`). Once an agent's stream is
admitted, its connection is taken from aiohttp, so that a protocol of our own
(:class:`gpuhealth.controller.stream.agent_socket.AgentStream`) applies each frame where
aiohttp's compiled parser yields it. Measured with the benches ``stream_heap_per_agent`` and
``stream_cpu_per_heartbeat`` (1,000 agents, 1 KiB tokens): 26.4 → 12.3 KiB of Python heap per
agent (the upgrade request and its headers, the request handler and its HTTP parser, the
handler's two tasks, the response and its writer all go), and 164-167 → 135-141 us of
controller CPU per Heartbeat (no future, no task woken, no second turn of the event loop per
frame). A ``WebSocketResponse`` keeps its handler task, its request and its queue of parsed
frames for the connection's whole life, and has no public way to give its connection up.

- ``aiohttp._websocket.reader.WebSocketDataQueue`` (private module, not exported): subclassed
  as :class:`_FrameQueue`. Its ``feed_data`` is a ``cpdef`` of the compiled class and
  ``feed_eof`` / ``set_exception`` plain methods, so the compiled parser honours our
  overrides: once detached, a frame goes to the stream as it is parsed instead of into the
  queue. Its ``_buffer`` (a ``public`` attribute of the compiled class) tells what waits for
  ``receive()``; its ``_protocol`` is replaced at the hand-over, so that the queue no longer
  holds aiohttp's request handler.
- ``WebSocketResponse._post_start(request, protocol, writer)``: overridden with a copy of
  aiohttp's own (3.14), building :class:`_FrameQueue` where aiohttp builds its queue; it
  reads and sets the response's ``_ws_protocol``, ``_writer``, ``_loop``, ``_reader``,
  ``_parser``, ``_max_msg_size``, ``_compress``, ``_decode_text``, ``_heartbeat`` and calls
  ``_reset_heartbeat`` / ``_on_data_received``. Its canary compares aiohttp's body with the
  one the copy was made from.
- ``WebSocketResponse._closing``, ``_closed`` and ``_writer`` (the transport, whether a close
  began), and ``_set_closed()``: at the hand-over the response is marked closed, so that
  aiohttp's end of the handler writes nothing (no close frame) to a connection it no longer
  owns, and its ``_parser`` is dropped.
- ``RequestHandler.set_parser`` and ``keep_alive`` (undocumented methods ``_post_start``
  calls), and the hand-over's ``transport = None`` then ``connection_lost(None)``: aiohttp
  forgets the connection (its server's table, its HTTP parser, the request) without closing
  the transport, and feeds the frame queue an end that :class:`_FrameQueue` ignores once
  detached.
- ``aiohttp.helpers.DEFAULT_CHUNK_SIZE``: the frame queue's limit, as aiohttp sets it.

**The API server's HTTP session** (:func:`ignore_environment`, :func:`environment_proxy`).
kubernetes_asyncio opens its aiohttp session with ``trust_env``: every request then looks up
``~/.netrc`` and the proxy variables in a worker thread (bench ``fleet_scale``: a measured
share of the controller's CPU when thousands of agents reconnect), and the session has no
public way to turn it off once made.

- ``ClientSession._trust_env``: set False on kubernetes_asyncio's session.
- ``aiohttp.helpers.get_env_proxy_for_url`` (not exported): the proxy the environment names
  for the API server, resolved once instead, as aiohttp would per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from aiohttp import BasicAuth, ClientSession, web
from aiohttp._websocket.reader import WebSocketDataQueue
from aiohttp.helpers import DEFAULT_CHUNK_SIZE, get_env_proxy_for_url
from aiohttp.http_websocket import WebSocketReader, WebSocketWriter, WSMessage, WSMessageTextBytes
from yarl import URL

Frame = WSMessage | WSMessageTextBytes
"""One parsed frame, as aiohttp's parser yields it."""


class FrameReceiver(Protocol):
    """What takes a detached connection's frames, as the parser yields them."""

    def received(self, msg: Frame) -> None:
        """One frame (binary, text, ping, pong, close)."""

    def broken(self, exc: BaseException) -> None:
        """The parser failed (a frame too large, a protocol error): nothing more is parsed."""


R = TypeVar("R", bound=FrameReceiver)


class _FrameQueue(WebSocketDataQueue):
    """aiohttp's frame queue; once :attr:`receiver` is set, every frame and error goes to it
    as the parser yields it, nothing is queued, and the end is the receiver's own to see."""

    __slots__ = ("receiver",)

    def __init__(
        self, protocol: web.RequestHandler, limit: int, *, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(protocol, limit, loop=loop)
        self.receiver: FrameReceiver | None = None

    def feed_data(self, data: Frame, size: int) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver.received(data)
            return
        super().feed_data(data, size)

    def feed_eof(self) -> None:
        if self.receiver is None:  # once detached, the receiver sees its own end
            super().feed_eof()

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver.broken(exc)
        elif exc_cause is None:  # (aiohttp's default cause is a private sentinel)
            super().set_exception(exc)
        else:
            super().set_exception(exc, exc_cause)

    @property
    def pending(self) -> int:
        """Frames queued for ``receive()`` and not read yet."""
        return len(self._buffer)


class DetachableWebSocket(web.WebSocketResponse):
    """aiohttp's WebSocket response whose connection can be taken from aiohttp once nothing
    waits for ``receive()``: :meth:`detach`."""

    _frames: _FrameQueue | None = None
    _handler: web.RequestHandler | None = None

    def _post_start(
        self, request: web.BaseRequest, protocol: str | None, writer: WebSocketWriter
    ) -> None:
        # aiohttp's _post_start (3.14), with _FrameQueue for WebSocketDataQueue
        self._ws_protocol = protocol
        self._writer = writer
        self._reset_heartbeat()
        loop = self._loop
        assert loop is not None
        handler = request.protocol
        self._handler = handler
        frames = _FrameQueue(handler, DEFAULT_CHUNK_SIZE, loop=loop)
        self._frames = frames
        self._reader = frames
        self._parser = WebSocketReader(
            frames, self._max_msg_size, bool(self._compress), self._decode_text
        )
        cb = None if self._heartbeat is None else self._on_data_received
        handler.set_parser(self._parser, data_received_cb=cb)
        handler.keep_alive(False)

    @property
    def queued(self) -> int:
        """Frames received and waiting for ``receive()``."""
        return 0 if self._frames is None else self._frames.pending

    @property
    def closing(self) -> bool:
        """A close was sent or received, or the connection is closed."""
        return self._closing or self._closed

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection, from ``prepare()`` until it is detached (uvloop's transports are no
        ``asyncio.Transport`` subclass, but have its methods)."""
        writer = self._writer
        return None if writer is None or self._frames is None else writer.transport

    @property
    def can_detach(self) -> bool:
        """Nothing waits for ``receive()`` (no frame, error or end) and the connection is open."""
        frames, transport = self._frames, self.transport
        return (
            frames is not None
            and transport is not None
            and not self.closing
            and frames.pending == 0
            and frames.exception() is None
            and not frames.is_eof()
            and not transport.is_closing()
        )

    def detach(self, make: Callable[[asyncio.Transport, WebSocketReader], R]) -> R:
        """Take the connection from aiohttp (only when :attr:`can_detach`): ``make`` gets its
        transport and the frame parser (the same instance, so that a frame split across the
        detach is parsed whole) and returns what receives every frame from now on, which is
        returned. The caller then sets the transport's protocol, and the aiohttp handler must
        return this response next, with no await in between."""
        if not self.can_detach:
            raise RuntimeError("frames are waiting or the connection is closing")
        frames, handler, transport = self._frames, self._handler, self.transport
        parser = self._parser
        assert frames is not None and handler is not None and transport is not None
        assert isinstance(parser, WebSocketReader)
        receiver = make(transport, parser)
        frames.receiver = receiver
        frames._protocol = receiver  # type: ignore[assignment]  # not aiohttp's request handler
        handler.transport = None  # so that aiohttp neither closes nor writes to it
        handler.connection_lost(None)
        self._set_closed()  # the response's end writes nothing (no close frame)
        self._frames = self._handler = None
        self._parser = None
        return receiver


# -- the API server's HTTP session ---------------------------------------------------------------


def ignore_environment(session: ClientSession) -> None:
    """Turn off ``trust_env`` on a session someone else opened: no netrc or proxy lookup in a
    worker thread per request."""
    session._trust_env = False


def environment_proxy(url: URL) -> tuple[URL, BasicAuth | None] | None:
    """The proxy (and its credentials) the environment names for ``url`` (``HTTPS_PROXY``,
    ``NO_PROXY``, ..., as aiohttp reads them with ``trust_env``); None: not proxied."""
    try:
        return get_env_proxy_for_url(url)
    except LookupError:
        return None
