"""The agent honours the controller's "come back after N s" (admission pacing) on a fake
clock: never sooner, with jitter, without growing its backoff; an Error without the field (an
older controller, or any other refusal) is an ordinary failure with backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.protocol import NODE_HEADER, Ack, Error, ErrorCode, encode
from tests.support.clock import FakeClock
from tests.support.stream import paced_client, running
from tests.support.wait import until


class Controller:
    """Answers each upgrade with the next scripted HTTP refusal (status, Retry-After) and
    each Hello with the next scripted frame (then Ack(0) for ever)."""

    def __init__(self, answers: list[Error]) -> None:
        self.answers = answers
        self.doors: list[tuple[int, str | None]] = []
        self.hellos = 0
        self.nodes: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.nodes.append(request.headers.get(NODE_HEADER))
        if self.doors:
            status, retry_after = self.doors.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.Response(status=status, headers=headers)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()
        self.hellos += 1
        answer = self.answers.pop(0) if self.answers else Ack(seq=0)
        await ws.send_bytes(encode(answer))
        if isinstance(answer, Error):
            await ws.close()
            return ws
        async for _ in ws:
            pass
        return ws


@pytest.fixture
async def served() -> AsyncIterator[tuple[Controller, str]]:
    ctl = Controller([])
    app = web.Application()
    app.router.add_get("/v1/stream", ctl.handle)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    yield ctl, f"ws://127.0.0.1:{ts.port}/v1/stream"
    await ts.close()


async def test_the_agent_comes_back_when_told_with_jitter(
    served: tuple[Controller, str], tmp_path: Path
) -> None:
    ctl, url = served
    ctl.answers = [
        Error(code=ErrorCode.RATE_LIMITED, message="later", retry_after_s=8.0),
        Error(code=ErrorCode.RATE_LIMITED, message="later", retry_after_s=8.0),
    ]
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock)) as c:
        await until(lambda: ctl.hellos == 1 and clock.pending_sleepers == 1)
        await clock.advance_and_settle(9.9)  # told 8 s; jitter 0.5 x rand 0.5 x 8 s: 10 s
        await asyncio.sleep(0.1)
        assert ctl.hellos == 1  # not sooner than told plus its jitter
        await clock.advance_and_settle(0.2)
        await until(lambda: ctl.hellos == 2 and clock.pending_sleepers == 1)
        await clock.advance_and_settle(10.1)
        await until(lambda: c.metrics.connected)
        assert ctl.hellos == 3
        assert c.metrics.deferred == 2
        assert c._backoff.attempt == 0  # pacing is not a failure: the backoff did not grow


async def test_a_refusal_without_retry_after_backs_off_as_before(
    served: tuple[Controller, str], tmp_path: Path
) -> None:
    """What an older controller sends (or any other refusal): exponential backoff."""
    ctl, url = served
    ctl.answers = [
        Error(code=ErrorCode.RATE_LIMITED, message="too many"),
        Error(code=ErrorCode.INTERNAL, message="retry"),
    ]
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock)) as c:
        await until(lambda: ctl.hellos == 1 and clock.pending_sleepers == 1)
        await clock.advance_and_settle(1.0)  # initial_s, no jitter
        await until(lambda: ctl.hellos == 2 and clock.pending_sleepers == 1)
        assert c._backoff.attempt == 2
        await clock.advance_and_settle(1.9)
        await asyncio.sleep(0.1)
        assert ctl.hellos == 2  # the second delay doubled
        await clock.advance_and_settle(0.1)
        await until(lambda: c.metrics.connected)
        assert c.metrics.deferred == 0


async def test_turned_away_before_the_upgrade_the_agent_comes_back_when_told(
    served: tuple[Controller, str], tmp_path: Path
) -> None:
    """HTTP 503 with ``Retry-After`` answers the upgrade itself: the same come-back as the
    Error frame's, and the request named the node."""
    ctl, url = served
    ctl.doors = [(503, "8")]
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock)) as c:
        await until(lambda: len(ctl.nodes) == 1 and clock.pending_sleepers == 1)
        assert ctl.nodes == ["node-a"] and ctl.hellos == 0
        await clock.advance_and_settle(9.9)  # told 8 s; jitter 0.5 x rand 0.5 x 8 s: 10 s
        await asyncio.sleep(0.1)
        assert len(ctl.nodes) == 1
        await clock.advance_and_settle(0.2)
        await until(lambda: c.metrics.connected)
        assert ctl.hellos == 1 and ctl.nodes == ["node-a", "node-a"]
        assert c.metrics.deferred == 1
        assert c._backoff.attempt == 0


@pytest.mark.parametrize(
    ("status", "retry_after"),
    [
        (503, None),  # no delay given
        (503, "Wed, 21 Oct 2026 07:28:00 GMT"),  # an HTTP-date: not what the controller sends
        (503, "-3"),
        (503, "1e9"),
        (429, "8"),  # another refusal
        (500, "8"),
    ],
)
async def test_any_other_refusal_of_the_upgrade_backs_off(
    served: tuple[Controller, str], tmp_path: Path, status: int, retry_after: str | None
) -> None:
    ctl, url = served
    ctl.doors = [(status, retry_after)]
    clock = FakeClock()
    async with running(paced_client(url, tmp_path, clock)) as c:
        await until(lambda: len(ctl.nodes) == 1 and clock.pending_sleepers == 1)
        assert c._backoff.attempt == 1 and c.metrics.deferred == 0
        await clock.advance_and_settle(1.0)  # initial_s, no jitter
        await until(lambda: c.metrics.connected)
