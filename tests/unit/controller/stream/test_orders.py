"""Remediation over the agents' stream: the controller's orders reach the node's agent (its
``seq`` counted per connection), the agent's action reports come back through its outbox to
the report sink, once each, acknowledged like every other message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.agent.stream.client import StreamClient
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import BackoffSettings, StreamClientSettings
from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.remediation.action_reports import ReportBook
from gpuhealth.controller.remediation.assembly import StreamOrders
from gpuhealth.controller.remediation.orders import UNNUMBERED
from gpuhealth.controller.stream.auth import StaticAuthenticator
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol.remediation import ActionReport, Order, ResetGpuOrder
from tests.support.stream import FakeAgentState, RecordingSink, agent_identity
from tests.support.wait import until

NODE = "node-a"
FAST = BackoffSettings(initial_s=0.01, max_s=0.05, jitter=0.1)


class ReportingAgent:
    """An :class:`OrderReceiver` that answers each order with a ``succeeded`` report."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.orders: list[Order] = []
        self.connections = 0

    def connection_started(self) -> None:
        self.connections += 1

    def receive(self, order: Order) -> None:
        self.orders.append(order)
        self.outbox.append(
            lambda seq: ActionReport(
                seq=seq,
                node=NODE,
                order_id=order.order_id,
                episode=order.episode,
                action="reset-gpu",
                state="succeeded",
                at=datetime.now(UTC),
            )
        )


@pytest.fixture
async def wired(tmp_path: Path) -> AsyncIterator[tuple[StreamServer, ReportBook, ReportingAgent]]:
    book = ReportBook()
    server = StreamServer(
        StreamServerSettings(hello_timeout_s=1.0),
        StaticAuthenticator({"tok": agent_identity(NODE)}),
        RecordingSink(),
        reports=book.record,
    )
    app = web.Application()
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=0)
    await ts.start_server()
    outbox = Outbox(tmp_path)
    agent = ReportingAgent(outbox)
    settings = StreamClientSettings(
        url=f"ws://127.0.0.1:{ts.port}/v1/stream", heartbeat_interval_s=3600, backoff=FAST
    )
    client = StreamClient(settings, FakeAgentState(NODE), outbox, lambda: "tok", orders=agent)
    task = asyncio.create_task(client.run())
    try:
        await until(lambda: NODE in server.connections, "the agent connected")
        yield server, book, agent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ts.close()
        outbox.close()


def request(attempt: int, episode: str = "node-a-abc123") -> ResetGpuOrder:
    return ResetGpuOrder(
        seq=UNNUMBERED,
        order_id=f"abc123-reset-gpu-{attempt}",
        episode=episode,
        issued_at=datetime(2026, 1, 1, tzinfo=UTC),
        deadline_s=60.0,
        gpus=["GPU-1"],
    )


async def test_an_order_reaches_the_agent_and_its_report_comes_back_once(
    wired: tuple[StreamServer, ReportBook, ReportingAgent],
) -> None:
    server, book, agent = wired
    orders = StreamOrders(server, SystemClock())
    assert await orders.send(NODE, request(1))
    assert await orders.send(NODE, request(2))
    await until(lambda: len(agent.orders) == 2, "both orders arrived")
    first, second = agent.orders
    assert isinstance(first, ResetGpuOrder)
    assert (first.seq, second.seq) == (1, 2)
    assert first.gpus == ["GPU-1"] and first.episode == "node-a-abc123"
    report = await until(lambda: book.latest(NODE, "abc123-reset-gpu-2"), "the second report")
    assert report.state == "succeeded" and book.latest(NODE, "abc123-reset-gpu-1") is not None
    await until(lambda: len(agent.outbox) == 0, "the reports were acknowledged")
    assert server.metrics.messages["action-report"] == 2
    assert server.metrics.orders["order-reset-gpu"] == 2
    assert agent.connections == 1


async def test_an_order_for_a_node_without_a_stream_is_undelivered(
    wired: tuple[StreamServer, ReportBook, ReportingAgent],
) -> None:
    server, _, agent = wired
    assert not await StreamOrders(server, SystemClock()).send("node-z", request(1, "ep"))
    assert agent.orders == []
