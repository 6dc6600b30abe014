"""The agent stream's WebSocket: aiohttp's for the handshake, then a small protocol of our own.

aiohttp serves the upgrade, the Hello and the admission (:class:`AgentSocket`, a
``WebSocketResponse``). Once a stream is accepted, :meth:`AgentSocket.hand_over` moves the
connection to :class:`AgentStream`, an :class:`asyncio.Protocol` on the same transport, and the
aiohttp handler returns. What aiohttp kept for a connection's whole life goes with it: the
upgrade request (its headers, the bearer token twice), the request handler with its HTTP parser
and message queue, the handler's two tasks and their frames, the response and its writer:
about 13 KiB per agent of 26 (bench ``controller_heap_kib_per_agent``), and a task switch, a
future and a second turn of the event loop per frame.

What stays is aiohttp's compiled frame parser (``WebSocketReader``, the same instance, so a
frame split across the hand-over is parsed whole), which from then on hands every frame to the
stream as it is parsed instead of queueing it. Binary and text frames go to the handler's
``on_message`` (the connection's, :class:`~gpuhealth.controller.stream.session.Connection`, which
applies them and writes the acknowledgement straight to the transport, :func:`binary_frame`);
a ping is answered, a close echoed; a protocol error (an oversized
frame: 1009) is answered with its close code.

The hand-over needs aiohttp's internals; they are all in
:mod:`gpuhealth.controller.aiohttp_internals` (:class:`DetachableWebSocket`, each
seam with its reason and a canary test), and this module uses aiohttp's public API besides.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Protocol

from aiohttp import WebSocketError, WSCloseCode, WSMsgType
from aiohttp.http_websocket import WebSocketReader

from gpuhealth.controller.aiohttp_internals import DetachableWebSocket, Frame
from gpuhealth.protocol import Error, encode


class StreamHandler(Protocol):
    """What a handed-over stream tells its owner (the server's record of the connection,
    :class:`~gpuhealth.controller.stream.session.Connection`)."""

    def on_message(self, mtype: WSMsgType, data: object) -> Error | None:
        """A binary frame's payload, a text frame's text, or a parser error (``ERROR``); the
        Error that refuses it (sent, then the connection closed with 1008), or None."""

    def on_lost(self) -> None:
        """The connection has ended (called once)."""


_FIN = 0x80
_OP_BINARY = 0x2
_OP_CLOSE = 0x8
_OP_PING = 0x9
_OP_PONG = 0xA
_LEN16 = struct.Struct("!BBH")
_LEN64 = struct.Struct("!BBQ")
_CLOSE_CODE = struct.Struct("!H")
_MAX_CONTROL = 125
"""A control frame's longest payload (RFC 6455 5.5)."""


def _frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked frame (a server's frame, RFC 6455 5.2) carrying ``payload``."""
    n = len(payload)
    first = _FIN | opcode
    if n < 126:
        return bytes((first, n)) + payload
    if n < 1 << 16:
        return _LEN16.pack(first, 126, n) + payload
    return _LEN64.pack(first, 127, n) + payload


def binary_frame(payload: bytes) -> bytes:
    """One final, unmasked binary frame carrying ``payload``."""
    return _frame(_OP_BINARY, payload)


def close_frame(code: int, message: bytes = b"") -> bytes:
    """A close frame with ``code`` and as much of ``message`` as a control frame holds."""
    return _frame(_OP_CLOSE, _CLOSE_CODE.pack(code) + message[: _MAX_CONTROL - 2])


class StreamSocket(Protocol):
    """What the server asks of an agent's connection, before the hand-over and after."""

    @property
    def closed(self) -> bool: ...

    @property
    def unread(self) -> int: ...

    def write_binary(self, payload: bytes) -> bool: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, *, code: int = ..., message: bytes = ...) -> bool: ...


class AgentSocket(DetachableWebSocket):
    """aiohttp's WebSocket for the handshake, whose connection is handed over to an
    :class:`AgentStream` once the stream is accepted."""

    @property
    def can_hand_over(self) -> bool:
        """Nothing waits for ``receive()`` (no frame, error or end) and the connection is open."""
        return self.can_detach

    def hand_over(self, handler: StreamHandler, *, close_timeout_s: float) -> AgentStream:
        """Move this connection to an :class:`AgentStream` told to ``handler`` (only when
        :attr:`can_hand_over`) and let aiohttp forget it: the handler must return this
        response next, with no await in between."""
        stream = self.detach(
            lambda transport, parser: AgentStream(transport, parser, handler, close_timeout_s)
        )
        stream.attach()
        return stream

    @property
    def unread(self) -> int:
        """Bytes written to this connection and not yet taken by the kernel (the peer is slow
        or not reading)."""
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def write_binary(self, payload: bytes) -> bool:
        """Write one binary frame now, without waiting for the socket (small frames only: an
        acknowledgement). False when the connection is closing or gone."""
        transport = self.transport
        if transport is None or self.closing or transport.is_closing():
            return False
        transport.write(binary_frame(payload))
        return True


class AgentStream(asyncio.Protocol):
    """An accepted agent's connection after the hand-over: frames parsed by aiohttp's
    compiled reader, answered here; writes straight to the transport."""

    __slots__ = (
        "_close_timeout_s",
        "_closer",
        "_closing",
        "_done",
        "_drain",
        "_handler",
        "_reader",
        "_transport",
        "pinged",
        "seen",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        reader: WebSocketReader,
        handler: StreamHandler,
        close_timeout_s: float,
    ) -> None:
        self._transport = transport
        self._reader: WebSocketReader | None = reader
        """Until the connection has ended (the reader's queue refers back to this stream)."""
        self._handler: StreamHandler | None = handler
        """Until the connection has ended."""
        self._close_timeout_s = close_timeout_s
        self._closing = False
        """A close frame was sent (or the agent's answered): nothing more is applied."""
        self._closer: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.seen = True
        """Something came from the agent since the last :meth:`keep_alive`."""
        self.pinged = False

    def attach(self) -> None:
        """Become the transport's protocol: from now on its bytes come here."""
        self._transport.set_protocol(self)

    # -- asyncio.Protocol --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.seen = True
        reader = self._reader
        if reader is not None:
            reader.feed_data(data)

    def eof_received(self) -> bool:
        return False  # the agent is done sending: close

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closing = True
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        for fut in (self._done, self._drain):
            if fut is not None and not fut.done():
                fut.set_result(None)
        self._done = self._drain = None
        self._reader = None  # no cycle left for the collector: freed when the transport goes
        handler, self._handler = self._handler, None
        if handler is not None:
            handler.on_lost()

    def pause_writing(self) -> None:
        self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- frames from the parser --------------------------------------------------------------

    def received(self, msg: Frame) -> None:
        mtype = msg.type
        if self._closing:
            if mtype is WSMsgType.CLOSE:  # the agent answered our close
                self._transport.close()
            return
        if mtype is WSMsgType.BINARY or mtype is WSMsgType.TEXT:
            handler = self._handler
            error = None if handler is None else handler.on_message(mtype, msg.data)
            if error is not None:
                self.refuse(error)
        elif mtype is WSMsgType.PING:
            self._transport.write(_frame(_OP_PONG, msg.data))
        elif mtype is WSMsgType.CLOSE:  # echo it (1000), and the connection is done
            self._closing = True
            self._transport.write(close_frame(WSCloseCode.OK))
            self._transport.close()

    def broken(self, exc: BaseException) -> None:
        """The parser failed (a frame too large, a protocol error): told to the handler,
        answered with its close code, and the connection closed (nothing more can be read)."""
        if self._handler is not None:
            self._handler.on_message(WSMsgType.ERROR, exc)
        code = exc.code if isinstance(exc, WebSocketError) else WSCloseCode.PROTOCOL_ERROR
        if not self._closing:
            self._closing = True
            self._transport.write(close_frame(code))
        self._transport.close()

    # -- writes ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closing or self._transport.is_closing()

    @property
    def unread(self) -> int:
        """Bytes written to this connection and not yet taken by the kernel."""
        return self._transport.get_write_buffer_size()

    def write_binary(self, payload: bytes) -> bool:
        """Write one binary frame now; False when the connection is closing or gone."""
        if self.closed:
            return False
        self._transport.write(binary_frame(payload))
        return True

    async def send_bytes(self, data: bytes) -> None:
        """Write one binary frame and wait until the socket takes it (while the transport's
        buffer is above its high-water mark)."""
        if not self.write_binary(data):
            raise ConnectionResetError("the agent's connection is closing")
        if self._drain is not None:
            await asyncio.shield(self._drain)

    def refuse(self, error: Error) -> None:
        """Send ``error``, then close (1008, the error's code as the reason)."""
        if self.write_binary(encode(error)):
            self.start_close(WSCloseCode.POLICY_VIOLATION, error.code.value.encode())

    def start_close(self, code: int, message: bytes = b"") -> bool:
        """Send a close frame; the connection ends when the agent answers it, or
        ``close_timeout_s`` later. False: it was closing already."""
        if self.closed:
            return False
        self._closing = True
        self._transport.write(close_frame(code, message))
        self._closer = asyncio.get_running_loop().call_later(
            self._close_timeout_s, self._transport.close
        )
        return True

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"") -> bool:
        """:meth:`start_close`, then wait until the connection has ended."""
        sent = self.start_close(code, message)
        if self._handler is not None:  # not ended yet
            if self._done is None:
                self._done = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._done)
        return sent

    def keep_alive(self) -> bool:
        """Once per ping interval: a ping to an agent silent since the last call; False (and
        the connection closed) when it answered nothing since that ping."""
        if self.seen:
            self.seen = self.pinged = False
            return True
        if self.pinged or self.closed:
            self._transport.close()
            return False
        self.pinged = True
        self._transport.write(_frame(_OP_PING, b""))
        return True
