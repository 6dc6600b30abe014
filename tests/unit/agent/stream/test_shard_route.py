"""The agent finds its shard's owner (docs/architecture.md, "Past one process"): it dials the
shard of its node's name, and when the replica there turns it away with HTTP 503 naming the
owning shard in ``Gpuhealth-Shard`` it comes back (after ``Retry-After``, on the fake clock) to
that shard's URL and keeps it; a header that names no shard is ignored, logged and counted.
The controller is a real aiohttp server on 127.0.0.1 with one path per shard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.agent.stream.metrics import StreamCollector
from gpuhealth.agent.stream.shard_route import ShardRoute
from gpuhealth.protocol import NODE_HEADER, Ack, ProtocolError, encode
from gpuhealth.protocol.shards import SHARD_HEADER, shard_of
from tests.support.clock import FakeClock
from tests.support.stream import paced_client, running
from tests.support.wait import until

SHARDS = 4
NODE = "node-a"
HOME = shard_of(NODE, SHARDS)
"""The shard of the node's name: the one the agent dials first."""
OWNER = (HOME + 1) % SHARDS
"""The shard that owns the node (its NVLink domain's), which HOME's replica names."""


@pytest.mark.parametrize(
    ("shard", "count", "header", "after", "moved"),
    [
        (1, 4, None, 1, False),  # not known there: keep the shard
        (1, 4, "1", 1, False),  # the one dialled (an owner between two Leases)
        (1, 4, "3", 3, True),
        (3, 4, "0", 0, True),  # and on again, when the node's domain moved
        (0, 1, "0", 0, False),
    ],
)
def test_a_refusal_moves_the_route_to_the_shard_it_names(
    shard: int, count: int, header: str | None, after: int, moved: bool
) -> None:
    route = ShardRoute("ws://c-{shard}/v1/stream", count, shard)
    assert route.follow(header) is moved
    assert (route.shard, route.url) == (after, f"ws://c-{after}/v1/stream")


@pytest.mark.parametrize("header", ["4", "-1", "x", "", "2.0", "1" * 30])
def test_a_garbage_header_keeps_the_route(header: str) -> None:
    route = ShardRoute("ws://c-{shard}/v1/stream", 4, 2)
    with pytest.raises(ProtocolError):
        route.follow(header)
    assert route.shard == 2


def test_the_first_shard_is_the_node_names() -> None:
    assert ShardRoute.for_node("ws://c-{shard}/s", SHARDS, NODE).shard == HOME
    one = ShardRoute.for_node("ws://c-{shard}/s", 1, NODE)
    assert (one.shard, one.url) == (0, "ws://c-0/s")


@dataclass
class Replicas:
    """One path per shard. Each upgrade to a shard with a scripted door left is answered with
    it (status and headers); any other is accepted: Ack(0), then held open."""

    doors: dict[int, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    dialled: list[int] = field(default_factory=list)
    open: list[web.WebSocketResponse] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        shard = int(request.match_info["shard"])
        assert request.headers.get(NODE_HEADER) == NODE
        self.dialled.append(shard)
        if self.doors.get(shard):
            status, headers = self.doors[shard].pop(0)
            return web.Response(status=status, headers=headers)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()  # Hello
        await ws.send_bytes(encode(Ack(seq=0)))
        self.open.append(ws)
        async for _ in ws:
            pass
        return ws


@pytest.fixture
async def served() -> AsyncIterator[tuple[Replicas, str]]:
    replicas = Replicas()
    app = web.Application()
    app.router.add_get("/s{shard}/v1/stream", replicas.handle)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    yield replicas, f"ws://127.0.0.1:{ts.port}/s{{shard}}/v1/stream"
    await ts.close()


async def test_turned_away_by_its_names_shard_the_agent_moves_to_the_owner_for_good(
    served: tuple[Replicas, str], tmp_path: Path
) -> None:
    replicas, url = served
    replicas.doors = {HOME: [(503, {"Retry-After": "8", SHARD_HEADER: str(OWNER)})]}
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock, NODE, SHARDS)) as c:
        assert c.metrics.shard == HOME
        await until(lambda: replicas.dialled == [HOME] and clock.pending_sleepers == 1)
        assert (c.route.shard, c.metrics.shard, c.metrics.shard_moves) == (OWNER, OWNER, 1)
        await clock.advance_and_settle(9.9)  # told 8 s; jitter 0.5 x rand 0.5 x 8 s: 10 s
        assert replicas.dialled == [HOME] and clock.pending_sleepers == 1  # not sooner
        await clock.advance_and_settle(0.2)
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [HOME, OWNER]
        assert c.metrics.deferred == 1 and c._backoff.attempt == 0  # pacing, not a failure
        # The owner's replica restarts: the agent comes back to the owner, not to its name's.
        await replicas.open.pop().close()
        await until(lambda: not c.metrics.connected and clock.pending_sleepers == 1)
        await clock.advance_and_settle(30.0)
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [HOME, OWNER, OWNER] and c.metrics.shard_moves == 1


@pytest.mark.parametrize("header", [str(SHARDS), "-1", "owner", "1.5", "9" * 12])
async def test_a_garbage_shard_header_is_ignored_and_counted(
    served: tuple[Replicas, str], tmp_path: Path, header: str
) -> None:
    replicas, url = served
    replicas.doors = {HOME: [(503, {"Retry-After": "8", SHARD_HEADER: header})]}
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock, NODE, SHARDS)) as c:
        await until(lambda: replicas.dialled == [HOME] and clock.pending_sleepers == 1)
        assert (c.route.shard, c.metrics.bad_shard_headers, c.metrics.shard_moves) == (HOME, 1, 0)
        await clock.advance_and_settle(10.1)  # the Retry-After is honoured all the same
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [HOME, HOME] and c.metrics.deferred == 1
        exported = {m.name: m.samples[0].value for m in StreamCollector(c.metrics).collect()}
        assert exported["gpuhealth_agent_stream_bad_shard_headers"] == 1.0
        assert exported["gpuhealth_agent_stream_shard"] == float(HOME)


async def test_a_refusal_naming_the_owner_without_retry_after_moves_after_the_backoff(
    served: tuple[Replicas, str], tmp_path: Path
) -> None:
    """Not what the controller sends (its not_owner 503 has Retry-After): the move holds, the
    wait is the ordinary failure's."""
    replicas, url = served
    replicas.doors = {HOME: [(503, {SHARD_HEADER: str(OWNER)})]}
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock, NODE, SHARDS)) as c:
        await until(lambda: replicas.dialled == [HOME] and clock.pending_sleepers == 1)
        assert c._backoff.attempt == 1 and c.metrics.deferred == 0
        await clock.advance_and_settle(1.0)  # initial_s, no jitter
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [HOME, OWNER]


async def test_another_refusal_naming_a_shard_does_not_move_the_agent(
    served: tuple[Replicas, str], tmp_path: Path
) -> None:
    """Only the not_owner answer (503) names the owner; a 500 carrying the header is a
    failure like any other."""
    replicas, url = served
    replicas.doors = {HOME: [(500, {SHARD_HEADER: str(OWNER)})]}
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock, NODE, SHARDS)) as c:
        await until(lambda: replicas.dialled == [HOME] and clock.pending_sleepers == 1)
        await clock.advance_and_settle(1.0)
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [HOME, HOME] and c.metrics.shard_moves == 0


async def test_with_one_shard_the_placeholder_is_shard_zero(
    served: tuple[Replicas, str], tmp_path: Path
) -> None:
    replicas, url = served
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock, NODE, shards=1)) as c:
        await until(lambda: c.metrics.connected)
        assert replicas.dialled == [0] and c.metrics.shard == 0
