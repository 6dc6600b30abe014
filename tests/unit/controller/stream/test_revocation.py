"""A token never outlives its pod: the stream server cuts the live stream of a gone pod at
once, forgets its cached reviews, refuses the token after, and asks again when unsure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import pytest

from gpuhealth.common.errors import TransientError
from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import Ack, Error, ErrorCode
from gpuhealth.protocol.codec import decode_controller
from tests.support.stream import RecordingSink, ServeStream, agent_identity, hello_frame
from tests.support.wait import until


class FakePods:
    def __init__(self) -> None:
        self.gone: set[str] = set()
        self.unsure = False
        self.asked = 0
        self._listeners: list[Callable[[str, str], None]] = []

    def subscribe(self, listener: Callable[[str, str], None]) -> None:
        self._listeners.append(listener)

    async def alive(self, uid: str, name: str) -> bool:
        self.asked += 1
        if self.unsure:
            raise TransientError("API server unreachable")
        return uid not in self.gone

    def delete(self, uid: str) -> None:
        self.gone.add(uid)
        for listener in self._listeners:
            listener(uid, "deleted")


@dataclass
class Env:
    server: StreamServer
    auth: StaticAuthenticator
    pods: FakePods
    url: str


@pytest.fixture
async def env(serve_stream: ServeStream) -> Env:
    auth = StaticAuthenticator({f"tok-{n}": agent_identity(n) for n in ("a", "b")})
    pods = FakePods()
    server = StreamServer(StreamServerSettings(), auth, RecordingSink(), pods=pods)
    return Env(server, auth, pods, await serve_stream(server))


async def hello(
    http: aiohttp.ClientSession, env: Env, node: str
) -> tuple[aiohttp.ClientWebSocketResponse, Ack | Error]:
    ws = await http.ws_connect(env.url, headers={"Authorization": f"Bearer tok-{node}"})
    await ws.send_bytes(hello_frame(node, stream="s"))
    async with asyncio.timeout(5):
        msg = await ws.receive()
    return ws, decode_controller(msg.data)


async def test_a_gone_pod_loses_its_live_stream_and_its_token(env: Env) -> None:
    async with aiohttp.ClientSession() as http:
        ws_a, first = await hello(http, env, "a")
        ws_b, _ = await hello(http, env, "b")
        assert first == Ack(seq=0)
        reviews = env.auth.calls
        env.pods.delete("uid-a")
        async with asyncio.timeout(5):
            cut = await ws_a.receive()
            closed = await ws_a.receive()
        error = decode_controller(cut.data)
        assert isinstance(error, Error) and error.code == ErrorCode.UNAUTHENTICATED
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await until(lambda: "a" not in env.server.connections, "the stream released")
        assert env.server.metrics.revoked["deleted"] == 1
        assert "b" in env.server.connections and not ws_b.closed  # others are untouched

        ws, again = await hello(http, env, "a")
        assert isinstance(again, Error) and again.code == ErrorCode.UNAUTHENTICATED
        assert env.auth.calls == reviews + 1  # the cached review was dropped, not reused
        assert env.server.metrics.rejected["pod_gone"] == 1
        await ws.close()
        await ws_b.close()


async def test_when_the_pod_cannot_be_checked_the_agent_is_told_to_retry(env: Env) -> None:
    env.pods.unsure = True
    async with aiohttp.ClientSession() as http:
        ws, reply = await hello(http, env, "a")
        assert isinstance(reply, Error) and reply.code == ErrorCode.INTERNAL
        assert "a" not in env.server.connections
        await ws.close()
