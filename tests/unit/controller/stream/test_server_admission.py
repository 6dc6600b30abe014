"""The stream server paces admission: bounded handshakes, a bounded queue, "come back after N
s" beyond it (at the door, before the upgrade: HTTP 503 with Retry-After); no review and no
write for a connection already gone; drain at shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.controller.stream.auth import Identity
from gpuhealth.controller.stream.metrics import StreamServerCollector
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import NODE_HEADER, Ack, Error, retry_after_from_header
from gpuhealth.protocol.codec import decode_controller
from tests.support.frames import hello_frame
from tests.support.stream import RecordingSink, ServeStream, agent_identity
from tests.support.wait import until


@dataclass
class GatedAuth:
    """Reviews wait until released (a slow API server); records whose token it reviewed."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    reviewed: list[str] = field(default_factory=list)

    async def review(self, token: str) -> Identity:
        self.reviewed.append(token)
        await self.gate.wait()
        return agent_identity(token.removeprefix("tok-"))


@dataclass
class Env:
    server: StreamServer
    auth: GatedAuth
    sink: RecordingSink
    url: str
    waiting: list[str]
    http: aiohttp.ClientSession


SETTINGS = StreamServerSettings(
    hello_timeout_s=2.0,
    watch_agent_pods=False,
    admission_max_concurrent=1,
    admission_max_waiting=1,
    admission_max_wait_s=30.0,
    admission_retry_after_min_s=2.0,
)


@pytest.fixture
async def env(serve_stream: ServeStream) -> AsyncIterator[Env]:
    auth, sink, waiting = GatedAuth(), RecordingSink(), []
    server = StreamServer(SETTINGS, auth, sink, waiting=lambda node, _s: waiting.append(node))
    url = await serve_stream(server)
    async with aiohttp.ClientSession() as http:
        yield Env(server, auth, sink, url, waiting, http)
    auth.gate.set()  # before the server closes (serve_stream's teardown runs after this one)


async def hello(env: Env, node: str) -> aiohttp.ClientWebSocketResponse:
    ws = await env.http.ws_connect(
        env.url,
        headers={"Authorization": f"Bearer tok-{node}"},
        # an agent that gives up waits this long for the close frame, then drops the socket
        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=0.05),
    )
    await ws.send_bytes(hello_frame(node))
    return ws


async def answer(ws: aiohttp.ClientWebSocketResponse) -> Ack | Error:
    raw = await asyncio.wait_for(ws.receive(), 5)
    msg = decode_controller(raw.data)
    assert isinstance(msg, Ack | Error)
    return msg


async def turned_away(env: Env, node: str) -> float:
    """Connect as ``node``'s agent expecting "come back later" before the upgrade: the
    ``Retry-After`` of the HTTP 503, which closes the connection."""
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await env.http.ws_connect(
            env.url, headers={"Authorization": f"Bearer tok-{node}", NODE_HEADER: node}
        )
    assert refused.value.status == 503
    assert refused.value.headers is not None
    assert refused.value.headers.get("Connection", "").lower() == "close"
    retry = retry_after_from_header(refused.value.headers.get("Retry-After"))
    assert retry is not None
    return retry


def gauges(env: Env) -> dict[str, float]:
    return {
        f.name: f.samples[0].value
        for f in StreamServerCollector(env.server.metrics).collect()
        if f.type == "gauge"
    }


async def test_beyond_the_queue_an_agent_is_turned_away_before_its_upgrade(env: Env) -> None:
    a = await hello(env, "node-a")
    await until(lambda: env.auth.reviewed == ["tok-node-a"])
    b = await hello(env, "node-b")
    await until(lambda: env.server.admission.waiting == 1)
    retry = await turned_away(env, "node-c")  # at once, while a's review still hangs
    assert retry >= 2.0  # admission_retry_after_min_s
    assert env.server.metrics.deferred["queue_full"] == 1
    assert env.server.metrics.messages["hello"] == 0  # nothing was read from c
    assert env.auth.reviewed == ["tok-node-a"]  # c's token cost no review
    assert {"node-b", "node-c"} <= set(env.waiting)  # they wait because of the controller
    assert gauges(env) == {
        "gpuhealth_stream_admission_in_flight": 1.0,
        "gpuhealth_stream_admission_waiting": 1.0,
        "gpuhealth_stream_admission_arriving": 0.0,
    }
    env.auth.gate.set()
    assert isinstance(await answer(a), Ack)
    assert isinstance(await answer(b), Ack)
    assert [n for n, _ in env.sink.connects] == ["node-a", "node-b"]
    for ws in (a, b):
        await ws.close()


async def test_connections_let_in_whose_hello_is_not_read_yet_count_at_the_door(
    env: Env,
) -> None:
    """A storm arrives faster than Hellos are read: every upgraded connection holds its place,
    so the one beyond the room is turned away at the door, not after an upgrade and a Hello."""
    let_in = [
        await env.http.ws_connect(
            env.url,
            headers={"Authorization": f"Bearer tok-{node}"},
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=0.05),
        )
        for node in ("node-a", "node-b")
    ]
    await until(lambda: env.server.admission.arriving == 2)
    await turned_away(env, "node-c")
    assert env.server.metrics.deferred["queue_full"] == 1
    for ws, node in zip(let_in, ("node-a", "node-b"), strict=True):
        await ws.send_bytes(hello_frame(node))
    await until(lambda: env.server.admission.waiting == 1)
    assert env.server.admission.arriving == 0 and env.server.admission.in_flight == 1
    await let_in[1].close()  # gone while waiting: its place is given back
    env.auth.gate.set()
    assert isinstance(await answer(let_in[0]), Ack)
    await until(lambda: env.server.admission.waiting == 0 and env.server.admission.in_flight == 0)
    assert env.server.admission.arriving == 0
    await let_in[0].close()


async def test_a_connection_that_never_says_hello_gives_its_place_back(env: Env) -> None:
    quiet = await env.http.ws_connect(env.url)
    await until(lambda: env.server.admission.arriving == 1)
    await quiet.close()
    await until(lambda: env.server.admission.arriving == 0)
    env.auth.gate.set()
    ws = await hello(env, "node-a")
    assert isinstance(await answer(ws), Ack)
    await ws.close()


async def test_a_node_header_beyond_a_node_name_is_not_noted(env: Env) -> None:
    a = await hello(env, "node-a")
    await until(lambda: env.auth.reviewed == ["tok-node-a"])
    b = await hello(env, "node-b")
    await until(lambda: env.server.admission.waiting == 1)
    await turned_away(env, "n" * 254)
    assert env.waiting == ["node-b"]
    env.auth.gate.set()
    for ws in (a, b):
        await answer(ws)
        await ws.close()


async def test_a_connection_gone_while_waiting_costs_no_review_and_no_traceback(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    a = await hello(env, "node-a")
    await until(lambda: env.auth.reviewed == ["tok-node-a"])
    b = await hello(env, "node-b")
    await until(lambda: env.server.admission.waiting == 1)
    await b.close()  # the agent gave up while waiting its turn
    await asyncio.sleep(0.2)
    env.auth.gate.set()
    assert isinstance(await answer(a), Ack)
    await until(lambda: env.server.metrics.gone["queued"] == 1)
    assert env.auth.reviewed == ["tok-node-a"]  # b was never reviewed
    assert [n for n, _ in env.sink.connects] == ["node-a"]
    assert env.server.admission.in_flight == 0 and env.server.admission.waiting == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "closing transport" not in out.out + out.err
    await a.close()


async def test_a_connection_gone_during_its_review_is_not_accepted(env: Env) -> None:
    a = await hello(env, "node-a")
    await until(lambda: env.auth.reviewed == ["tok-node-a"])
    await a.close()
    await asyncio.sleep(0.2)
    env.auth.gate.set()
    await until(lambda: env.server.metrics.gone["review"] == 1)
    assert env.sink.connects == [] and env.server.connections == {}
    assert env.auth.reviewed == ["tok-node-a"]
    assert env.server.admission.in_flight == 0


async def test_drain_tells_waiting_and_new_agents_to_come_back_soon(env: Env) -> None:
    env.auth.gate.set()
    live = await hello(env, "node-a")
    assert isinstance(await answer(live), Ack)
    env.auth.gate.clear()
    busy = await hello(env, "node-b")
    await until(lambda: env.auth.reviewed[-1:] == ["tok-node-b"])
    queued = await hello(env, "node-c")
    await until(lambda: env.server.admission.waiting == 1)
    await asyncio.wait_for(env.server.drain(), 5)
    told = await answer(queued)
    assert isinstance(told, Error) and told.retry_after_s == 2.0  # the minimum: go elsewhere
    assert await turned_away(env, "node-d") == 2.0  # new agents: at the door
    assert env.server.metrics.deferred["draining"] == 2
    # the handshake still under review close_timeout_s into the drain was cancelled
    cut = await asyncio.wait_for(busy.receive(), 5)
    assert cut.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    env.auth.gate.set()
    await asyncio.sleep(0.1)
    assert "node-b" not in env.server.connections
    closed = await asyncio.wait_for(live.receive(), 5)
    assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    for ws in (busy, queued):
        await ws.close()


async def test_drain_cuts_a_connection_still_waiting_for_its_hello(env: Env) -> None:
    """A handler that would otherwise hold the shutdown (no Hello yet, up to
    ``hello_timeout_s``) is cancelled ``close_timeout_s`` after the drain began."""
    server = StreamServer(
        StreamServerSettings(hello_timeout_s=60.0, close_timeout_s=0.2, watch_agent_pods=False),
        env.auth,
        env.sink,
    )
    app = web.Application()
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    try:
        ws = await env.http.ws_connect(f"ws://127.0.0.1:{ts.port}/v1/stream")
        await until(lambda: len(server._handlers) == 1)
        began = asyncio.get_running_loop().time()
        await asyncio.wait_for(server.drain(), 5)
        assert asyncio.get_running_loop().time() - began < 1.0
        assert server._handlers == set()
        closed = await asyncio.wait_for(ws.receive(), 5)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await ws.close()
    finally:
        await ts.close()


async def test_a_request_that_is_no_upgrade_gives_its_place_back(env: Env) -> None:
    """A plain GET of the stream's path (a probe, a scanner) is refused by the upgrade and
    holds no place at the door: twenty of them (the room is two) leave it for the agents."""
    for _ in range(20):
        async with env.http.get(env.url) as resp:
            assert resp.status == 400
    assert env.server.admission.arriving == 0
    env.auth.gate.set()
    ws = await hello(env, "node-a")
    assert isinstance(await answer(ws), Ack)
    await ws.close()
