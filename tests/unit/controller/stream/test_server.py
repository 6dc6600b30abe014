"""The stream server on 127.0.0.1 with a table-driven fake authenticator, and the real client.

Bad peers (garbage, text, truncated, oversized, replayed, out-of-order, unauthenticated)
are each answered as specified while a healthy agent on the same server is undisturbed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.agent.stream.client import StreamClient, make_ssl_context
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import BackoffSettings, StreamClientSettings
from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import MAX_FRAME_BYTES, Ack, Error, ErrorCode, decode, encode
from gpuhealth.protocol.codec import decode_controller
from tests.support.stream import (
    FakeAgentState,
    RecordingSink,
    agent_identity,
    event_frame,
    hello_frame,
    transition,
)
from tests.support.wait import until

NODES = ("node-a", "node-b", "node-c", "node-d")
FAST = BackoffSettings(initial_s=0.01, max_s=0.05, jitter=0.1)


@dataclass
class Env:
    server: StreamServer
    sink: RecordingSink
    url: str
    ts: TestServer


def table() -> StaticAuthenticator:
    t = {f"tok-{n}": agent_identity(n) for n in NODES}
    t["tok-other-sa"] = agent_identity("node-a", user="system:serviceaccount:default:intruder")
    return StaticAuthenticator(t)


async def start(
    settings: StreamServerSettings,
    ssl_ctx: ssl.SSLContext | None = None,
    authn: StaticAuthenticator | None = None,
) -> Env:
    sink = RecordingSink()
    server = StreamServer(settings, authn or table(), sink)
    app = web.Application()
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server(ssl=ssl_ctx)
    scheme = "wss" if ssl_ctx else "ws"
    return Env(server, sink, f"{scheme}://127.0.0.1:{ts.port}/v1/stream", ts)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = await start(StreamServerSettings(hello_timeout_s=0.3, rate_burst=1000))
    yield e
    await e.ts.close()


def client(env: Env, node: str, state_dir: Path, **kw: object) -> StreamClient:
    settings = StreamClientSettings(url=env.url, heartbeat_interval_s=3600, backoff=FAST)
    return StreamClient(
        settings,
        FakeAgentState(node),
        Outbox(state_dir),
        lambda: f"tok-{node}",
        **kw,  # type: ignore[arg-type]
    )


async def raw(env: Env, token: str | None = "tok-node-b") -> aiohttp.ClientWebSocketResponse:
    session = aiohttp.ClientSession()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ws = await session.ws_connect(env.url, headers=headers, max_msg_size=0)
    ws._gpuhealth_session = session  # type: ignore[attr-defined]
    return ws


async def done(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.close()
    await ws._gpuhealth_session.close()  # type: ignore[attr-defined]


async def replies(ws: aiohttp.ClientWebSocketResponse) -> list[Ack | Error]:
    """Everything the server sends until it closes the connection."""
    out: list[Ack | Error] = []
    async with asyncio.timeout(3):
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.BINARY:
                out.append(decode_controller(msg.data))
    return out


class HealthyAgent:
    """A healthy agent publishing events in the background; ``finish()`` checks it was never
    disturbed and that every event it published arrived once, in order."""

    def __init__(self, env: Env, state_dir: Path) -> None:
        self.env = env
        self.client = client(env, "node-a", state_dir)
        self.published: list[int] = []
        self._stop = asyncio.Event()

    async def __aenter__(self) -> HealthyAgent:
        self._run = asyncio.create_task(self.client.run())
        self._pub = asyncio.create_task(self._publish())
        await until(lambda: len(self.env.sink.events("node-a")) >= 3)
        return self

    async def _publish(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.client.publish(transition(n))
            self.published.append(n)
            await asyncio.sleep(0.002)

    async def finish(self) -> None:
        self._stop.set()
        await self._pub
        await until(lambda: len(self.client.outbox) == 0)
        assert self.client.metrics.connects == 1, "the healthy agent was disconnected"
        assert [e.xid for e in self.env.sink.events("node-a")] == self.published

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        for t in (self._pub, self._run):
            t.cancel()
        await asyncio.gather(self._pub, self._run, return_exceptions=True)


async def test_healthy_agent_snapshot_events_acks(env: Env, tmp_path: Path) -> None:
    c = client(env, "node-a", tmp_path)
    task = asyncio.create_task(c.run())
    for n in range(1, 6):
        c.publish(transition(n))
    await until(lambda: len(env.sink.events("node-a")) == 5 and len(c.outbox) == 0)
    assert [e.xid for e in env.sink.events()] == [1, 2, 3, 4, 5]
    kinds = [type(m).__name__ for _, m in env.sink.messages]
    assert "Snapshot" in kinds
    assert env.sink.connects[0][1].node == "node-a"
    assert c.metrics.connected
    c.queue_heartbeat()
    await until(lambda: any(type(m).__name__ == "Heartbeat" for _, m in env.sink.messages))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await until(lambda: env.sink.disconnects == ["node-a"])


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"\xc1\xc1garbage"], ErrorCode.MALFORMED),
        ([hello_frame("node-b"), b"\x92\x01"], ErrorCode.MALFORMED),
        ([hello_frame("node-b"), event_frame(1, "node-b")[:-4]], ErrorCode.MALFORMED),
        ([event_frame(1, "node-b")], ErrorCode.OUT_OF_ORDER),
        (
            [hello_frame("node-b"), event_frame(2, "node-b"), event_frame(2, "node-b")],
            ErrorCode.OUT_OF_ORDER,
        ),
        (
            [hello_frame("node-b"), event_frame(3, "node-b"), event_frame(1, "node-b")],
            ErrorCode.OUT_OF_ORDER,
        ),
        ([hello_frame("node-b"), hello_frame("node-b")], ErrorCode.OUT_OF_ORDER),
        ([hello_frame("node-b"), event_frame(1, "node-c")], ErrorCode.FORBIDDEN),
        ([hello_frame("node-b", protocol=2)], ErrorCode.UNSUPPORTED_VERSION),
    ],
)
async def test_bad_frames_answered_while_healthy_agent_continues(
    env: Env, tmp_path: Path, frames: list[bytes], code: ErrorCode
) -> None:
    async with HealthyAgent(env, tmp_path) as healthy:
        ws = await raw(env)
        for f in frames:
            await ws.send_bytes(f)
        got = await replies(ws)
        await done(ws)
        assert isinstance(got[-1], Error) and got[-1].code == code
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
        assert env.server.metrics.errors[code.value] == 1
        await healthy.finish()


async def test_text_and_oversized_frames(env: Env, tmp_path: Path) -> None:
    async with HealthyAgent(env, tmp_path) as healthy:
        ws = await raw(env)
        await ws.send_bytes(hello_frame("node-b"))
        await ws.send_str("hello")
        got = await replies(ws)
        await done(ws)
        assert got[-1] == Error(code=ErrorCode.MALFORMED, message="text frames are not accepted")
        ws = await raw(env)
        await ws.send_bytes(hello_frame("node-b"))
        await ws.send_bytes(b"\x00" * (MAX_FRAME_BYTES + 1))
        await replies(ws)
        await done(ws)
        assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        assert env.server.metrics.errors["too-large"] == 1
        assert env.server.metrics.errors["malformed"] == 1
        await healthy.finish()


async def test_replayed_frames_acked_once_delivered(env: Env) -> None:
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    for s in (1, 2):
        await ws.send_bytes(event_frame(s, "node-b"))
    async with asyncio.timeout(3):
        acks = [decode_controller((await ws.receive()).data) for _ in range(3)]
    assert acks == [Ack(seq=0), Ack(seq=1), Ack(seq=2)]
    await done(ws)
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b", seq=1))
    for s in (1, 2, 3):
        await ws.send_bytes(event_frame(s, "node-b"))
    async with asyncio.timeout(3):
        acks = [decode_controller((await ws.receive()).data) for _ in range(4)]
    assert acks == [Ack(seq=2), Ack(seq=1), Ack(seq=2), Ack(seq=3)]
    await done(ws)
    assert [e.seq for e in env.sink.events("node-b")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("token", "node", "code", "reason"),
    [
        (None, "node-b", ErrorCode.UNAUTHENTICATED, "missing_token"),
        ("nope", "node-b", ErrorCode.UNAUTHENTICATED, "unauthenticated"),
        ("tok-node-b", "node-c", ErrorCode.FORBIDDEN, "node_mismatch"),
        ("tok-other-sa", "node-a", ErrorCode.FORBIDDEN, "wrong_service_account"),
    ],
)
async def test_auth_rejections(
    env: Env, token: str | None, node: str, code: ErrorCode, reason: str
) -> None:
    ws = await raw(env, token)
    await ws.send_bytes(hello_frame(node))
    got = await replies(ws)
    await done(ws)
    assert [e.code for e in got if isinstance(e, Error)] == [code]
    assert env.server.metrics.rejected == {reason: 1}
    assert env.sink.connects == []


async def test_hello_timeout(env: Env) -> None:
    ws = await raw(env)
    got = await replies(ws)
    await done(ws)
    assert got[-1].code == ErrorCode.OUT_OF_ORDER  # type: ignore[union-attr]
    assert env.server.metrics.rejected["hello_timeout"] == 1


async def test_newer_connection_replaces_older(env: Env) -> None:
    old = await raw(env)
    await old.send_bytes(hello_frame("node-b", stream="s1"))
    assert decode_controller((await old.receive()).data) == Ack(seq=0)
    new = await raw(env)
    await new.send_bytes(hello_frame("node-b", stream="s1"))
    got = await replies(old)
    assert [e.code for e in got if isinstance(e, Error)] == [ErrorCode.REPLACED]
    assert decode_controller((await new.receive()).data) == Ack(seq=0)
    await new.send_bytes(event_frame(1, "node-b"))
    assert decode_controller((await new.receive()).data) == Ack(seq=1)
    assert env.sink.disconnects == []  # the replaced connection does not count as a disconnect
    assert len(env.sink.connects) == 2
    await done(old)
    await done(new)
    await until(lambda: env.sink.disconnects == ["node-b"])


async def test_rate_limit() -> None:
    e = await start(StreamServerSettings(rate_per_s=0.0, rate_burst=3))
    try:
        ws = await raw(e)
        await ws.send_bytes(hello_frame("node-b"))
        for s in range(1, 6):
            await ws.send_bytes(event_frame(s, "node-b"))
        got = await replies(ws)
        await done(ws)
        assert got[-1] == Error(code=ErrorCode.RATE_LIMITED, message="message rate limit exceeded")
        assert len(e.sink.events()) == 3
    finally:
        await e.ts.close()


async def test_sink_failure_is_internal_error_and_server_survives(env: Env, tmp_path: Path) -> None:
    def boom(node: str, msg: object) -> None:
        raise RuntimeError("fleet bug")

    env.sink.on_message = boom  # type: ignore[method-assign]
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b"))
    await ws.send_bytes(event_frame(1, "node-b"))
    got = await replies(ws)
    await done(ws)
    assert [e.code for e in got if isinstance(e, Error)] == [ErrorCode.INTERNAL]
    assert env.server.tracker.applied("node-b", "s1") == 0  # not recorded: it will be replayed


async def test_controller_outage_buffers_and_replays(tmp_path: Path) -> None:
    """The client buffers while the server is down and replays exactly once after restart."""
    e = await start(StreamServerSettings())
    port = e.ts.port
    c = client(e, "node-a", tmp_path)
    task = asyncio.create_task(c.run())
    c.publish(transition(1))
    await until(lambda: len(e.sink.events()) == 1 and len(c.outbox) == 0)
    await e.ts.close()
    for n in range(2, 12):
        c.publish(transition(n))
    await until(lambda: not c.metrics.connected)
    assert len(c.outbox) >= 10
    sink2 = e.sink
    server2 = StreamServer(StreamServerSettings(), table(), sink2, tracker=e.server.tracker)
    app = web.Application()
    server2.add_routes(app)
    ts2 = TestServer(app, host="127.0.0.1", port=port)
    await ts2.start_server()
    try:
        await until(lambda: len(c.outbox) == 0, timeout_s=5)
        assert [ev.xid for ev in sink2.events()] == list(range(1, 12))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ts2.close()


async def test_agent_restart_replays_from_disk(env: Env, tmp_path: Path) -> None:
    """Events queued while disconnected survive a restart of the agent (a new Outbox)."""
    box = Outbox(tmp_path)
    for n in range(1, 4):
        box.append(lambda seq, n=n: _event_for(seq, n))
    box.close()
    c = client(env, "node-a", tmp_path)
    assert len(c.outbox) == 3
    task = asyncio.create_task(c.run())
    await until(lambda: len(c.outbox) == 0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [e.xid for e in env.sink.events()] == [1, 2, 3]


def _event_for(seq: int, n: int):  # type: ignore[no-untyped-def]
    from gpuhealth.agent.stream.client import event_from_transition

    return event_from_transition(seq, "node-a", transition(n))


async def test_tls_with_verified_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    e = await start(StreamServerSettings(), server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    try:
        c = client(e, "node-a", tmp_path / "a", ssl_context=make_ssl_context(str(ca_file)))
        task = asyncio.create_task(c.run())
        c.publish(transition(1))
        await until(lambda: len(e.sink.events()) == 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        other = trustme.CA()
        other_file = tmp_path / "other.pem"
        other.cert_pem.write_to_path(str(other_file))
        bad = client(e, "node-b", tmp_path / "b", ssl_context=make_ssl_context(str(other_file)))
        task = asyncio.create_task(bad.run())
        # each refused handshake is a failed attempt followed by a backoff: wait for two
        await until(lambda: bad._backoff.attempt >= 2, "two refused TLS handshakes")
        assert bad.metrics.connects == 0 and bad.metrics.connected is False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert e.sink.connects[0][0] == "node-a" and len(e.sink.connects) == 1
    finally:
        await e.ts.close()


def test_decode_of_error_frame() -> None:
    assert decode(b"\x82\xa4type\xa5error\xa4code\xa8replaced") == Error(code=ErrorCode.REPLACED)


async def test_rejected_agent_retries_and_recovers_after_token_rotation(
    env: Env, tmp_path: Path
) -> None:
    from gpuhealth.agent.stream.token import TokenFile

    token_file = tmp_path / "token"
    token_file.write_text("expired-token")
    settings = StreamClientSettings(url=env.url, heartbeat_interval_s=3600, backoff=FAST)
    c = StreamClient(
        settings, FakeAgentState("node-a"), Outbox(tmp_path / "s"), TokenFile(token_file).get
    )
    task = asyncio.create_task(c.run())
    try:
        c.publish(transition(1))
        await until(lambda: env.server.metrics.rejected["unauthenticated"] >= 2)
        assert c.metrics.connects == 0 and not c.metrics.connected
        assert len(c.outbox) >= 1  # kept while refused
        tmp = tmp_path / "token.new"
        tmp.write_text("tok-node-a")
        tmp.replace(token_file)  # the kubelet rotates the projected token
        await until(lambda: len(c.outbox) == 0)
        assert [e.xid for e in env.sink.events()] == [1]
        assert c.metrics.connected and c.metrics.connects == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_sink_failure_on_connect_releases_the_connection(env: Env) -> None:
    def boom(node: str, hello: object) -> None:
        raise RuntimeError("fleet bug")

    env.sink.on_connect = boom  # type: ignore[method-assign]
    ws = await raw(env)
    await ws.send_bytes(hello_frame("node-b"))
    got = await replies(ws)
    await done(ws)
    assert [e.code for e in got if isinstance(e, Error)] == [ErrorCode.INTERNAL]
    await until(lambda: env.server.connections == {})


async def test_client_reconnects_when_acks_stop(tmp_path: Path) -> None:
    """A controller that accepts (its first Ack) but then never acknowledges is treated as
    dead (Ack watchdog)."""
    frames: list[bytes] = []

    async def mute(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()  # Hello
        await ws.send_bytes(encode(Ack(seq=0)))
        async for msg in ws:
            frames.append(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", mute)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    settings = StreamClientSettings(
        url=f"ws://127.0.0.1:{ts.port}/v1/stream",
        ack_timeout_s=0.1,
        heartbeat_interval_s=0.01,
        backoff=FAST,
    )
    c = StreamClient(settings, FakeAgentState("node-a"), Outbox(tmp_path), lambda: "t")
    task = asyncio.create_task(c.run())
    try:
        await until(lambda: c.metrics.disconnects >= 2)
        assert c.metrics.connects >= 2
        assert len(c.outbox) >= 1  # the snapshot is still waiting for its Ack
        assert frames  # the snapshot was sent after the first Ack
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ts.close()


async def test_client_sends_nothing_until_hello_is_answered(tmp_path: Path) -> None:
    """Until the controller answers Hello the agent sends nothing more and no Ack deadline
    runs; a controller that never answers is left after ``accept_timeout_s``."""
    frames: list[list[bytes]] = []

    async def silent(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        mine: list[bytes] = []
        frames.append(mine)
        async for msg in ws:
            mine.append(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", silent)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    settings = StreamClientSettings(
        url=f"ws://127.0.0.1:{ts.port}/v1/stream",
        accept_timeout_s=0.2,
        ack_timeout_s=0.05,
        heartbeat_interval_s=0.01,
        backoff=FAST,
    )
    c = StreamClient(settings, FakeAgentState("node-a"), Outbox(tmp_path), lambda: "t")
    task = asyncio.create_task(c.run())
    try:
        await until(lambda: len(frames) >= 3)
        assert c.metrics.connects == 0
        for conn in frames[:2]:  # each connection: the Hello only
            assert [type(decode(f)).__name__ for f in conn] == ["Hello"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ts.close()


async def test_an_address_sending_forged_tokens_is_throttled_without_reviews() -> None:
    """Every forged token costs a TokenReview (refusals are never cached): after
    ``auth_failed_reviews_burst`` of them one address is refused RATE_LIMITED unasked; a
    token that validates is not charged."""
    authn = table()
    settings = StreamServerSettings(hello_timeout_s=1.0, auth_failed_reviews_burst=3)
    e = await start(settings, authn=authn)
    try:
        got: list[object] = []
        for token in ["forged-0", "tok-node-b", *(f"forged-{i}" for i in range(1, 7))]:
            ws = await raw(e, token)
            await ws.send_bytes(hello_frame("node-b"))
            frame = decode_controller((await ws.receive()).data)
            got.append(frame.code if isinstance(frame, Error) else frame)
            await done(ws)
        unauth, limited = ErrorCode.UNAUTHENTICATED, ErrorCode.RATE_LIMITED
        assert got == [unauth, Ack(seq=0), unauth, unauth, limited, limited, limited, limited]
        assert authn.calls == 4  # three forged tokens and the valid one were reviewed
        assert e.server.metrics.rejected == {"unauthenticated": 3, "review_throttled": 4}
    finally:
        await e.ts.close()
