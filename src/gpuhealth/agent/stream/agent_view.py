"""What the stream client reads from the agent: Hello facts, snapshots and heartbeats, all from
the cached node snapshot (an :class:`~gpuhealth.agent.stream.client.AgentView`).

Heartbeats carry each allocation's utilisation since the previous heartbeat (attributed per
process where NVML and the host allow it, see :mod:`gpuhealth.agent.usage`) and per-GPU telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuhealth.agent.health.rails import RailStatus
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.observations import GpuSample
from gpuhealth.agent.stream.client import HelloInfo
from gpuhealth.protocol import (
    Allocation,
    AllocationUsage,
    Condition,
    GpuStatus,
    GpuTelemetry,
    NicPortInfo,
)
from gpuhealth.protocol.v1 import MAX_NIC_GPUS, MAX_RAIL_VERDICTS


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

    def allocations_unknown(self) -> str | None:
        return self._state.snapshot().allocations_unknown

    def node_conditions(self) -> list[Condition]:
        return list(self._state.snapshot().node_conditions)

    def nics(self) -> list[NicPortInfo]:
        return [nic_port_info(p) for p in self._state.snapshot().nics]

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        snap = self._state.snapshot()
        usage = self._usage.drain(snap.allocations)
        return usage, [s.telemetry for s in snap.statuses if s.telemetry is not None]


def nic_port_info(p: RailStatus) -> NicPortInfo:
    """One port on the wire (every string cut to its bound)."""
    s = p.sample
    return NicPortInfo(
        device=s.device[:64],
        port=s.port,
        link_layer=s.link_layer[:32],
        port_state=(s.port_state or "")[:32],
        phys_state=(s.phys_state or "")[:32],
        rate_gbps=s.rate_gbps,
        expected_rate_gbps=p.expected_rate_gbps,
        netdev=s.netdev[:32],
        model=s.model[:128],
        gpus=[g.uuid for g in p.gpus][:MAX_NIC_GPUS],
        affinity=s.affinity[:32],
        flaps=min(p.flaps, 2**31 - 1),
        last_flap=p.last_flap,
        verdicts=[c.code for c in p.verdicts][:MAX_RAIL_VERDICTS],
    )
