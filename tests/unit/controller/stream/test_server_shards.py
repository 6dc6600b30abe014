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
from gpuhealth.protocol.shards import SHARD_HEADER
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


@dataclass
class Owned:
    """The shards the replica owns (a test moves them)."""

    shards: frozenset[int] = OWNED
    asked: list[str] = field(default_factory=list)
    labelled_elsewhere: set[str] = field(default_factory=set)
    """Nodes whose label names another shard than their name's (a domain's)."""

    def serves(self, node: str) -> bool:
        return shard_of(node, SHARDS) in self.shards and node not in self.labelled_elsewhere

    async def shard_of(self, node: str) -> int | None:
        """As the Node's label says: a node named ``domain-*`` in shard 0, others by name."""
        self.asked.append(node)
        return 0 if node.startswith("domain-") else shard_of(node, SHARDS)


@pytest.fixture
def owned() -> Owned:
    return Owned()


@pytest.fixture
async def env(serve_stream: ServeStream, owned: Owned) -> AsyncIterator[Env]:
    auth, sink = Auth(), RecordingSink()
    server = StreamServer(SETTINGS, auth, sink, serves=owned.serves, shard_of=owned.shard_of)
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
    # The 503 names the shard that owns the node: the agent goes there.
    assert refused.value.headers.get(SHARD_HEADER) == str(shard_of(THEIRS, SHARDS))


async def test_the_door_names_no_shard_it_does_not_know(
    serve_stream: ServeStream, owned: Owned
) -> None:
    server = StreamServer(SETTINGS, Auth(), RecordingSink(), serves=owned.serves)
    url = await serve_stream(server)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, headers={NODE_HEADER: THEIRS})
    assert refused.value.status == 503
    assert refused.value.headers is not None
    assert SHARD_HEADER not in refused.value.headers


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


async def test_a_node_of_a_domain_is_sent_to_its_domains_shard(env: Env, owned: Owned) -> None:
    node = next(f"domain-{i}" for i in range(100) if shard_of(f"domain-{i}", SHARDS) in OWNED)
    owned.labelled_elsewhere.add(node)  # by name it is ours; by its label, shard 0's
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await connect(env, node, header=True)
    assert refused.value.headers is not None
    assert refused.value.headers.get(SHARD_HEADER) == "0"
    assert owned.asked == [node]


async def test_a_shard_lost_closes_its_agents_streams_going_away(env: Env, owned: Owned) -> None:
    ws = await connect(env, OURS, header=True)
    assert isinstance(await answer(ws), Ack)
    assert await env.server.close_unserved() == 0  # still ours: nothing closed
    owned.shards = frozenset()
    assert await env.server.close_unserved() == 1
    closed = await ws.receive(timeout=5)
    assert closed.type is aiohttp.WSMsgType.CLOSE
    assert closed.data == aiohttp.WSCloseCode.GOING_AWAY
