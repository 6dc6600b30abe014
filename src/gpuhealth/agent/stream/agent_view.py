"""What the stream client reads from the agent: Hello facts, snapshots and heartbeats, all from
the cached node snapshot (an :class:`~gpuhealth.agent.stream.client.AgentView`).

Heartbeats carry each allocation's utilisation since the previous heartbeat (attributed per
process where NVML and the host allow it, see :mod:`gpuhealth.agent.usage`) and per-GPU telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.observations import GpuSample
from gpuhealth.agent.stream.client import HelloInfo
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    GpuStatus,
    GpuTelemetry,
)


class UsageTally(Protocol):
    """Accumulates samples between heartbeats (:class:`~gpuhealth.agent.usage.UsageAccumulator`)."""

    def record(self, sample: GpuSample) -> None: ...
    def drain(self, allocations: Sequence[Allocation]) -> list[AllocationUsage]: ...


class SnapshotAgentView:
    """Implements :class:`~gpuhealth.agent.stream.client.AgentView` from the cached
    snapshot."""

    def __init__(
        self,
        state: NodeSnapshotCache,
        usage: UsageTally,
        *,
        version: str,
        expected_gpus: int | None = None,
        boot_id: str,
        capabilities: Sequence[str] = (),
    ) -> None:
        self._state = state
        self._usage = usage
        self._version = version
        self._expected = expected_gpus
        self._boot_id = boot_id
        self._capabilities = list(capabilities)

    def hello_info(self) -> HelloInfo:
        snap = self._state.snapshot()
        return HelloInfo(
            node=self._state.node,
            boot_id=self._boot_id,
            agent_version=self._version,
            gpus=[s.info for s in snap.statuses],
            expected_gpus=self._expected,
            capabilities=list(self._capabilities),
        )

    def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
        snap = self._state.snapshot()
        return list(snap.statuses), list(snap.allocations)

    def node_conditions(self) -> list[Condition]:
        return list(self._state.snapshot().node_conditions)

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        snap = self._state.snapshot()
        usage = self._usage.drain(snap.allocations)
        return usage, [s.telemetry for s in snap.statuses if s.telemetry is not None]
