"""The agent stream's WebSocket: aiohttp's, with binary frames handled where they are parsed.

aiohttp hands every received frame to the handler task through a queue: a future set, the task
woken on the next turn of the event loop, ``receive()`` and an ``await ws.send_bytes`` for the
acknowledgement. With 20,000 agents that machinery cost more CPU per Heartbeat than the
Heartbeat itself (bench ``stream_cpu_per_heartbeat``: ~95 us of ~155 us before a frame
reached our code). Once a stream is accepted, :class:`AgentSocket` calls ``on_binary`` with each
binary frame as aiohttp's parser yields it, inside ``data_received``, and the handler writes its
acknowledgement straight to the transport (:func:`binary_frame`): no task switch, no future,
no second turn of the loop. Everything else (close, ping, text, protocol errors, a frame the
handler declines) still goes through the queue to the handler task, as before.

The seam is aiohttp's own: ``_post_start`` builds the response's frame queue and parser; this
subclass builds the same with a queue whose ``feed_data`` (a ``cpdef`` method of aiohttp's
compiled ``WebSocketDataQueue``, so a Python override is honoured by the compiled parser) may
take a binary frame first. The pinned aiohttp minor version (``pyproject.toml``) and every
stream test guard it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from aiohttp import WSMsgType, web
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader
from aiohttp.helpers import DEFAULT_CHUNK_SIZE
from aiohttp.http_websocket import WebSocketWriter, WSMessage, WSMessageTextBytes
from aiohttp.web_request import BaseRequest

BinaryHandler = Callable[[bytes], bool]
"""Takes one binary frame's payload; False leaves the frame to the handler task's queue."""

_BINARY_FIN = 0x82
_LEN16 = struct.Struct("!BBH")
_LEN64 = struct.Struct("!BBQ")


def binary_frame(payload: bytes) -> bytes:
    """One final, unmasked binary frame (a server's frame, RFC 6455 5.2) carrying ``payload``."""
    n = len(payload)
    if n < 126:
        return bytes((_BINARY_FIN, n)) + payload
    if n < 1 << 16:
        return _LEN16.pack(_BINARY_FIN, 126, n) + payload
    return _LEN64.pack(_BINARY_FIN, 127, n) + payload


class _FrameQueue(WebSocketDataQueue):
    """aiohttp's frame queue, offering each binary frame to ``on_binary`` first (when set)."""

    on_binary: BinaryHandler | None = None

    def feed_data(self, data: WSMessage | WSMessageTextBytes, size: int) -> None:
        on_binary = self.on_binary
        if on_binary is not None and data.type is WSMsgType.BINARY and on_binary(data.data):
            return
        super().feed_data(data, size)

    @property
    def pending(self) -> int:
        """Frames queued for the handler task and not read yet."""
        return len(self._buffer)


class AgentSocket(web.WebSocketResponse):
    """A WebSocketResponse whose binary frames go to :meth:`take_binary`'s handler once set."""

    _frames: _FrameQueue | None = None

    def _post_start(
        self, request: BaseRequest, protocol: str | None, writer: WebSocketWriter
    ) -> None:
        # aiohttp's _post_start (3.14), with _FrameQueue for WebSocketDataQueue
        self._ws_protocol = protocol
        self._writer = writer
        self._reset_heartbeat()
        loop = self._loop
        assert loop is not None
        frames = _FrameQueue(request._protocol, DEFAULT_CHUNK_SIZE, loop=loop)
        self._frames = frames
        self._reader = frames
        self._parser = WebSocketReader(
            frames, self._max_msg_size, bool(self._compress), self._decode_text
        )
        cb = None if self._heartbeat is None else self._on_data_received
        request.protocol.set_parser(self._parser, data_received_cb=cb)
        request.protocol.keep_alive(False)

    @property
    def queued(self) -> int:
        """Frames received and waiting for ``receive()``."""
        return 0 if self._frames is None else self._frames.pending

    def take_binary(self, on_binary: BinaryHandler | None) -> None:
        """From now on, offer each binary frame to ``on_binary`` as it is parsed (None: stop).
        Frames already queued stay queued: read them (``queued``) before taking over."""
        if self._frames is None:
            raise RuntimeError("not prepared")
        self._frames.on_binary = on_binary

    @property
    def unread(self) -> int:
        """Bytes written to this connection and not yet taken by the kernel (the peer is slow
        or not reading)."""
        writer = self._writer
        transport = None if writer is None else writer.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def write_binary(self, payload: bytes) -> bool:
        """Write one binary frame now, without waiting for the socket (small frames only: an
        acknowledgement). False when the connection is closing or gone."""
        writer = self._writer
        if writer is None or self._closing or self._closed:
            return False
        transport = writer.transport
        if transport is None or transport.is_closing():
            return False
        transport.write(binary_frame(payload))
        return True
