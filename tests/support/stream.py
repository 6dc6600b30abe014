"""Stream test pieces (unit and integration): a recording IngestSink, a fake agent state for the
real StreamClient, a storm of transitions and a TokenReview identity for an agent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.stream.client import HelloInfo, StreamClient
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import BackoffSettings, StreamClientSettings
from gpuhealth.common.clock import Clock
from gpuhealth.controller.stream.auth import (
    NODE_NAME_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    Identity,
    service_account_username,
)
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Heartbeat,
    Hello,
    NicPortInfo,
    Snapshot,
)
from tests.support.frames import AT, event_frame, hello_frame

__all__ = ["AT", "event_frame", "hello_frame"]

AGENT_USER = service_account_username("gpuhealth", "gpuhealth-agent")


@dataclass
class RecordingSink:
    connects: list[tuple[str, Hello]] = field(default_factory=list)
    messages: list[tuple[str, Snapshot | Event | Heartbeat]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)

    def on_connect(self, node: str, hello: Hello) -> None:
        self.connects.append((node, hello))

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        self.messages.append((node, msg))

    def on_disconnect(self, node: str) -> None:
        self.disconnects.append(node)

    def events(self, node: str | None = None) -> list[Event]:
        return [m for n, m in self.messages if isinstance(m, Event) and node in (None, n)]

    def xids(self, node: str) -> list[int | None]:
        """The XID numbers of ``node``'s Events in arrival order (a storm carries n as XID)."""
        return [e.xid for e in self.events(node)]


@dataclass
class FakeAgentState:
    node: str
    gpus: int = 2

    def hello_info(self) -> HelloInfo:
        return HelloInfo(
            node=self.node,
            boot_id="boot-1",
            agent_version="test",
            gpus=[GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(self.gpus)],
            expected_gpus=self.gpus,
        )

    def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
        return (
            [
                GpuStatus(info=GpuInfo(index=i, uuid=f"GPU-{i}"), state="healthy")
                for i in range(self.gpus)
            ],
            [],
        )

    def node_conditions(self) -> list[Condition]:
        return []

    def nics(self) -> list[NicPortInfo]:
        return []

    def allocations_unknown(self) -> str | None:
        return None

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        return [], [GpuTelemetry(uuid=f"GPU-{i}", temperature_c=40.0) for i in range(self.gpus)]


def transition(n: int, gpu: int = 0) -> Transition:
    """The n-th transition of a storm: alternates healthy <-> unhealthy, carries n as the XID."""
    cur = "unhealthy" if n % 2 else "healthy"
    prev = "healthy" if n % 2 else "unhealthy"
    return Transition(
        kind="transition",
        uuid=f"GPU-{gpu}",
        index=gpu,
        previous=prev,
        current=cur,
        conditions=(),
        at=AT,
        xid=n,
    )


def agent_identity(node: str, user: str = AGENT_USER, *, pod_uid: str | None = None) -> Identity:
    """A reviewed agent token bound to node ``node`` and its pod ``agent-<node>``."""
    return Identity(
        authenticated=True,
        username=user,
        audiences=("gpuhealth",),
        extra={
            NODE_NAME_KEY: (node,),
            POD_NAME_KEY: (f"agent-{node}",),
            POD_UID_KEY: (pod_uid or f"uid-{node}",),
        },
    )


ServeStream = Callable[[StreamServer], Awaitable[str]]
"""The unit tests' ``serve_stream`` fixture (tests/unit/conftest.py): a server's ws:// URL."""


def paced_client(
    url: str, state_dir: Path, clock: Clock, node: str = "node-a", shards: int = 1
) -> StreamClient:
    """A real StreamClient whose waits are exact on the fake clock: backoff 1 s doubling, no
    jitter; a come-back-later of N s waits 1.25 N (``retry_after_jitter`` 0.5, rand 0.5)."""
    settings = StreamClientSettings(
        url=url,
        heartbeat_interval_s=3600,
        backoff=BackoffSettings(initial_s=1.0, max_s=30.0, jitter=0.0, retry_after_jitter=0.5),
    )
    return StreamClient(
        settings,
        FakeAgentState(node),
        Outbox(state_dir),
        lambda: "t",
        clock=clock,
        rand=lambda: 0.5,
        shards=shards,
    )


@contextlib.asynccontextmanager
async def running(client: StreamClient) -> AsyncIterator[StreamClient]:
    """The client's connection loop, cancelled and its outbox closed on the way out."""
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        client.outbox.close()
