"""Simulated agents for fleet-shape tests: per node the agent's own stream client
(:class:`gpuhealth.agent.stream.client.StreamClient`: its outbox, Hello and Snapshot on every
connect, acknowledgements, reconnect back-off) with a bound token of an agent pod, and a
health state the test holds instead of GPUs. Dozens of them run in the test's event loop,
where as many agent processes would not fit a CI machine.

A test changes a node's state (:meth:`SimAgent.set_fault`, :meth:`SimAgent.allocate`) and the
agent sends a Snapshot, as the agent does when its health changes; :meth:`SimAgent.xid` sends
an XID Event. :meth:`SimAgent.delivered` waits until the controller acknowledged everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.stream.client import HelloInfo, StreamClient
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import BackoffSettings, StreamClientSettings
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    NicPortInfo,
)
from tests.support.protocol import gpu_uuid
from tests.support.wait import until

RECONNECT = BackoffSettings(initial_s=0.1, max_s=1.0, jitter=0.3)
"""The agent's back-off, shortened (its shape kept: doubling, jitter) so a test's fleet is
back within seconds of a failover."""


@dataclass
class SimHealth:
    """What a node's agent would say: its GPUs' conditions and allocations."""

    node: str
    gpus: int
    faults: dict[int, Condition] = field(default_factory=dict)
    allocations: list[Allocation] = field(default_factory=list)

    def hello_info(self) -> HelloInfo:
        return HelloInfo(
            node=self.node,
            boot_id="boot-1",
            agent_version="sim",
            gpus=[GpuInfo(index=i, uuid=gpu_uuid(i, self.node)) for i in range(self.gpus)],
            expected_gpus=self.gpus,
        )

    def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
        gpus = []
        for i in range(self.gpus):
            fault = self.faults.get(i)
            gpus.append(
                GpuStatus(
                    info=GpuInfo(index=i, uuid=gpu_uuid(i, self.node)),
                    state=fault.severity if fault else "healthy",  # type: ignore[arg-type]
                    conditions=[fault] if fault else [],
                )
            )
        return gpus, list(self.allocations)

    def node_conditions(self) -> list[Condition]:
        return []

    def allocations_unknown(self) -> str | None:
        return None  # the test holds the allocations: known

    def nics(self) -> list[NicPortInfo]:
        return []

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        return [], [
            GpuTelemetry(uuid=gpu_uuid(i, self.node), temperature_c=40.0) for i in range(self.gpus)
        ]


class SimAgent:
    def __init__(self, url: str, node: str, token: str, state_dir: Path, gpus: int) -> None:
        self.health = SimHealth(node, gpus)
        settings = StreamClientSettings(url=url, heartbeat_interval_s=5.0, backoff=RECONNECT)
        self.client = StreamClient(settings, self.health, Outbox(state_dir), lambda: token)

    @property
    def node(self) -> str:
        return self.health.node

    @property
    def connected(self) -> bool:
        return self.client.metrics.connected

    def set_fault(self, index: int, condition: Condition | None) -> None:
        """GPU ``index`` now carries ``condition`` (None: healthy again); a Snapshot says so."""
        if condition is None:
            self.health.faults.pop(index, None)
        else:
            self.health.faults[index] = condition
        self.client.queue_snapshot()

    def allocate(self, allocations: Sequence[Allocation]) -> None:
        self.health.allocations = list(allocations)
        self.client.queue_snapshot()

    def xid(self, index: int, xid: int) -> None:
        """An XID on GPU ``index`` that does not change its state."""
        self.client.publish(
            Transition(
                kind="xid",
                uuid=gpu_uuid(index, self.node),
                index=index,
                previous="healthy",
                current="healthy",
                conditions=(),
                at=datetime.now(UTC),
                xid=xid,
            )
        )

    async def delivered(self, timeout_s: float = 15.0) -> None:
        """Until the controller acknowledged everything queued."""
        await until(
            lambda: len(self.client.outbox) == 0 or None, f"{self.node} acked", timeout_s=timeout_s
        )


@asynccontextmanager
async def running(agents: Sequence[SimAgent]) -> AsyncIterator[None]:
    """The agents' streams as tasks, cancelled on exit."""
    tasks = [asyncio.create_task(a.client.run(), name=f"agent-{a.node}") for a in agents]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for a in agents:
            a.client.outbox.close()
