"""Canaries for the aiohttp internals the controller relies on
(``gpuhealth.controller.aiohttp_internals``): one per private name, each asserting that the
installed aiohttp still has it with the shape the seam uses, so that an aiohttp upgrade fails
here, naming the seam, instead of as a stream that silently stops applying frames or an API
client that looks up netrc in a thread per request.

What the seams do together is tested by ``stream/test_agent_socket.py`` (the hand-over on
asyncio and uvloop, plain and TLS, through the controller's own site) and
``kube/test_client.py`` (the proxy resolved once, ``trust_env`` off).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import inspect
import textwrap
from collections import deque

import pytest
from aiohttp import ClientSession, WSMsgType, web
from aiohttp._websocket.reader import WebSocketDataQueue
from aiohttp.helpers import DEFAULT_CHUNK_SIZE, get_env_proxy_for_url
from aiohttp.http_websocket import WebSocketReader
from yarl import URL

from gpuhealth.controller.aiohttp_internals import (
    DetachableWebSocket,
    environment_proxy,
    ignore_environment,
)
from gpuhealth.controller.stream.agent_socket import binary_frame

POST_START_AST_SHA256 = "81a7f63d1ea05fcb8702051fe357e9e332332897d6edd5a1d1f948bd732b8eb8"
"""aiohttp 3.14.5's ``WebSocketResponse._post_start``, its syntax tree (comments and layout
left out): the body ``DetachableWebSocket._post_start`` is a copy of."""


def seam(name: str) -> str:
    return (
        f"aiohttp's {name} is not what gpuhealth.controller.aiohttp_internals relies "
        "on any more: review that seam against the installed aiohttp"
    )


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


class _Handler:
    """What the frame queue asks of its protocol before the hand-over."""

    _reading_paused = False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class _Receiver:
    def __init__(self) -> None:
        self.frames: list[tuple[WSMsgType, object]] = []
        self.errors: list[BaseException] = []

    def received(self, msg: object) -> None:
        self.frames.append((msg.type, msg.data))  # type: ignore[attr-defined]

    def broken(self, exc: BaseException) -> None:
        self.errors.append(exc)


def _masked(payload: bytes, opcode: int = 0x2) -> bytes:
    """A client's (masked) final frame; mask 0 leaves the payload as it is."""
    assert len(payload) < 126
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\0\0\0\0" + payload


# -- aiohttp._websocket.reader.WebSocketDataQueue (subclassed) ------------------------------


def test_the_frame_queue_class_is_where_the_seam_imports_it() -> None:
    assert isinstance(WebSocketDataQueue, type), seam("_websocket.reader.WebSocketDataQueue")


async def test_the_frame_queue_is_made_from_protocol_limit_and_loop() -> None:
    queue = WebSocketDataQueue(_Handler(), 16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    assert queue.exception() is None and not queue.is_eof(), seam("WebSocketDataQueue()")


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("feed_data", ["self", "data", "size"]),
        ("feed_eof", ["self"]),
        ("set_exception", ["self", "exc", "exc_cause"]),
        ("exception", ["self"]),
        ("is_eof", ["self"]),
    ],
)
def test_the_frame_queue_methods_overridden_or_called(method: str, params: list[str]) -> None:
    assert _params(getattr(WebSocketDataQueue, method)) == params, seam(
        f"WebSocketDataQueue.{method}"
    )


async def test_the_frame_queue_buffer_holds_what_waits_for_receive() -> None:
    queue = WebSocketDataQueue(_Handler(), 1 << 16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    assert isinstance(queue._buffer, deque), seam("WebSocketDataQueue._buffer")
    WebSocketReader(queue, 0, False, False).feed_data(_masked(b"x"))
    assert len(queue._buffer) == 1, seam("WebSocketDataQueue._buffer")


async def test_the_frame_queue_protocol_can_be_replaced() -> None:
    queue = WebSocketDataQueue(_Handler(), 16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    other = _Handler()
    queue._protocol = other  # type: ignore[assignment]
    assert queue._protocol is other, seam("WebSocketDataQueue._protocol")


async def test_the_compiled_parser_honours_the_queue_overrides() -> None:
    """``feed_data`` is a ``cpdef`` of the compiled queue, ``feed_eof`` and ``set_exception``
    plain methods: a subclass's Python overrides are what the compiled parser calls. Were one
    a ``cdef``, a detached stream would never see its frames."""
    seen: list[str] = []

    class Overridden(WebSocketDataQueue):
        def feed_data(self, data: object, size: int) -> None:
            seen.append("feed_data")

        def feed_eof(self) -> None:
            seen.append("feed_eof")

        def set_exception(self, exc: BaseException, exc_cause: object = None) -> None:
            seen.append("set_exception")

    queue = Overridden(_Handler(), 16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    reader = WebSocketReader(queue, 8, False, False)
    reader.feed_data(_masked(b"frame"))
    reader.feed_eof()
    reader.feed_data(_masked(b"x" * 9))  # over max_msg_size: the parser fails
    assert seen == ["feed_data", "feed_eof", "set_exception"], seam(
        "WebSocketDataQueue.feed_data/feed_eof/set_exception as overridable methods"
    )


def test_the_parser_is_the_compiled_one() -> None:
    """The measured CPU per Heartbeat is with aiohttp's compiled parser."""
    assert WebSocketReader.__module__ == "aiohttp._websocket.reader_c", seam(
        "compiled WebSocketReader (aiohttp._websocket.reader_c)"
    )


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65_535, 65_536, 70_000])
async def test_the_parser_reads_a_stream_frame_split_anywhere(n: int) -> None:
    """What :func:`binary_frame` writes, aiohttp's parser reads (as an agent's client does)."""
    payload = bytes(i % 251 for i in range(n))
    queue = WebSocketDataQueue(_Handler(), 1 << 20, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    reader = WebSocketReader(queue, 0, False, False)
    frame = binary_frame(payload)
    assert reader.feed_data(frame[:3]) == (False, b"")
    reader.feed_data(frame[3:])
    msg = await queue.read()
    assert (msg.type, msg.data) == (WSMsgType.BINARY, payload)


# -- WebSocketResponse._post_start (overridden with a copy) and the response's attributes -----


def test_post_start_is_the_one_the_copy_was_made_from() -> None:
    post_start = web.WebSocketResponse._post_start
    assert _params(post_start) == ["self", "request", "protocol", "writer"], seam("_post_start")
    tree = ast.dump(ast.parse(textwrap.dedent(inspect.getsource(post_start))))
    assert hashlib.sha256(tree.encode()).hexdigest() == POST_START_AST_SHA256, seam(
        "WebSocketResponse._post_start (its body changed: compare "
        "DetachableWebSocket._post_start with it, then update POST_START_AST_SHA256)"
    )


def test_prepare_calls_post_start() -> None:
    assert "_post_start" in inspect.getsource(web.WebSocketResponse.prepare), seam(
        "WebSocketResponse.prepare calling _post_start"
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("_ws_protocol", type(None)),
        ("_writer", type(None)),
        ("_reader", type(None)),
        ("_parser", type(None)),
        ("_loop", type(None)),
        ("_heartbeat", type(None)),
        ("_closed", bool),
        ("_closing", bool),
        ("_compress", bool),
        ("_decode_text", bool),
        ("_max_msg_size", int),
    ],
)
def test_the_response_attributes_read_and_set(name: str, kind: type) -> None:
    ws = DetachableWebSocket(max_msg_size=1024, compress=False)
    assert isinstance(getattr(ws, name, ...), kind), seam(f"WebSocketResponse.{name}")


@pytest.mark.parametrize("name", ["_reset_heartbeat", "_on_data_received", "_set_closed"])
def test_the_response_methods_called(name: str) -> None:
    assert _params(getattr(web.WebSocketResponse, name, None)) == ["self"], seam(
        f"WebSocketResponse.{name}()"
    )


def test_set_closed_marks_the_response_closed() -> None:
    ws = web.WebSocketResponse()
    ws._set_closed()
    assert ws.closed, seam("WebSocketResponse._set_closed")


# -- aiohttp's request handler: the parser set, keep-alive off, the connection forgotten -------


def test_the_request_handler_takes_the_frame_parser() -> None:
    assert _params(web.RequestHandler.set_parser) == ["self", "parser", "data_received_cb"], seam(
        "RequestHandler.set_parser"
    )
    assert _params(web.RequestHandler.keep_alive) == ["self", "val"], seam(
        "RequestHandler.keep_alive"
    )


def test_the_request_handler_forgets_a_connection_without_a_transport() -> None:
    """``transport = None`` then ``connection_lost(None)``: aiohttp's ``force_close`` closes
    only a transport it still has."""
    slots = {name for cls in web.RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert "transport" in slots, seam("RequestHandler.transport")
    assert _params(web.RequestHandler.connection_lost) == ["self", "exc"], seam(
        "RequestHandler.connection_lost"
    )
    source = inspect.getsource(web.RequestHandler.force_close)
    assert "if self.transport is not None" in source, seam("RequestHandler.force_close")


# -- aiohttp.helpers.DEFAULT_CHUNK_SIZE ------------------------------------------------------


def test_the_frame_queue_limit() -> None:
    assert isinstance(DEFAULT_CHUNK_SIZE, int) and DEFAULT_CHUNK_SIZE > 0, seam(
        "helpers.DEFAULT_CHUNK_SIZE"
    )


# -- the API server's HTTP session -----------------------------------------------------------


async def test_a_session_trusts_the_environment_through_one_attribute() -> None:
    """``ClientSession.trust_env`` (public, read-only) reads ``_trust_env``, which the request
    path consults."""
    async with ClientSession(trust_env=True) as session:
        assert session.trust_env is True
        ignore_environment(session)
        assert session.trust_env is False, seam("ClientSession._trust_env")
    assert "self._trust_env" in inspect.getsource(ClientSession._request), seam(
        "ClientSession._request reading _trust_env"
    )


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"HTTPS_PROXY": "http://user:pw@proxy.example:3128"}, ("proxy.example", "user")),
        ({"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "api.example"}, None),
        ({}, None),
    ],
    ids=["proxied", "no-proxy", "none"],
)
def test_the_environment_proxy_lookup(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: tuple[str, str] | None
) -> None:
    assert _params(get_env_proxy_for_url) == ["url"], seam("helpers.get_env_proxy_for_url")
    for var in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    got = environment_proxy(URL("https://api.example:6443"))
    if want is None:
        assert got is None, seam("helpers.get_env_proxy_for_url (LookupError when not proxied)")
    else:
        assert got is not None, seam("helpers.get_env_proxy_for_url")
        proxy, auth = got
        assert (proxy.host, auth.login if auth else None) == want, seam(
            "helpers.get_env_proxy_for_url (the proxy and its credentials)"
        )
