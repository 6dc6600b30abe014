"""Past one process: a replica serves only the nodes of the shards it owns. An agent of
another shard is turned away at the door (HTTP 503 with Retry-After, before any review), or
after its Hello when the upgrade named no node; an agent of its own shards streams as ever."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from gpuhealth.controller.shards.assignment import shard_of
from gpuhealth.controller.stream.auth import Identity
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import NODE_HEADER, Ack, Error, ErrorCode, retry_after_from_header
from gpuhealth.protocol.codec import decode_controller
from tests.support.frames import hello_frame
from tests.support.stream import RecordingSink, ServeStream, agent_identity

SHARDS = 4
OWNED = frozenset({1, 2})
SETTINGS = StreamServerSettings(watch_agent_pods=False, not_owner_retry_after_s=7.5)
OURS = next(f"gpu-node-{i}" for i in range(100) if shard_of(f"gpu-node-{i}", SHARDS) in OWNED)
THEIRS = next(f"gpu-node-{i}" for i in range(100) if shard_of(f"gpu-node-{i}", SHARDS) not in OWNED)


@dataclass
class Auth:
    reviewed: list[str] = field(default_factory=list)

    async def review(self, token: str) -> Identity:
        self.reviewed.append(token)
        return agent_identity(token.removeprefix("tok-"))


@dataclass
class Env:
    server: StreamServer
    auth: Auth
    sink: RecordingSink
    url: str
    http: aiohttp.ClientSession


@pytest.fixture
async def env(serve_stream: ServeStream) -> AsyncIterator[Env]:
    auth, sink = Auth(), RecordingSink()
    server = StreamServer(SETTINGS, auth, sink, serves=lambda node: shard_of(node, SHARDS) in OWNED)
    url = await serve_stream(server)
    async with aiohttp.ClientSession() as http:
        yield Env(server, auth, sink, url, http)


async def connect(env: Env, node: str, *, header: bool) -> aiohttp.ClientWebSocketResponse:
    headers = {"Authorization": f"Bearer tok-{node}"}
    if header:
        headers[NODE_HEADER] = node
    ws = await env.http.ws_connect(env.url, headers=headers)
    await ws.send_bytes(hello_frame(node))
    return ws


async def answer(ws: aiohttp.ClientWebSocketResponse) -> Ack | Error:
    msg = decode_controller((await ws.receive(timeout=5)).data)
    assert isinstance(msg, Ack | Error)
    return msg


async def test_an_agent_of_another_shard_is_turned_away_at_the_door(env: Env) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await connect(env, THEIRS, header=True)
    assert refused.value.status == 503
    assert refused.value.headers is not None
    retry = retry_after_from_header(refused.value.headers.get("Retry-After"))
    assert retry == math.ceil(SETTINGS.not_owner_retry_after_s)
    assert env.server.metrics.deferred["not_owner"] == 1
    assert env.auth.reviewed == []  # its token cost no review
    assert env.sink.connects == []


async def test_an_agent_that_names_no_node_is_turned_away_after_its_hello(env: Env) -> None:
    ws = await connect(env, THEIRS, header=False)
    msg = await answer(ws)
    assert isinstance(msg, Error)
    assert msg.code == ErrorCode.RATE_LIMITED
    assert msg.retry_after_s == SETTINGS.not_owner_retry_after_s
    assert env.server.metrics.deferred["not_owner"] == 1
    assert env.auth.reviewed == []
    assert env.sink.connects == []


@pytest.mark.parametrize("header", [True, False])
async def test_an_agent_of_an_owned_shard_streams(env: Env, header: bool) -> None:
    ws = await connect(env, OURS, header=header)
    assert isinstance(await answer(ws), Ack)
    assert [n for n, _ in env.sink.connects] == [OURS]
    assert env.server.metrics.deferred["not_owner"] == 0
    await ws.close()
