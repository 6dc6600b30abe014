"""What the stream client reads from the agent runtime (its ``AgentStateProvider``).

Heartbeats carry each allocation's utilisation since the previous heartbeat. PodResources
names containers but not their processes, so the figure is the mean of the whole GPU's
utilisation over the samples in between (``attribution="gpu"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.model import GpuSample
from agent.state import NodeState
from agent.stream.client import HelloInfo
from protocol import Allocation, AllocationUsage, GpuStatus, GpuTelemetry

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's boot id (changes on every reboot); ``unknown`` where there is none."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()[:128] or "unknown"
    except OSError:
        return "unknown"


@dataclass
class _Usage:
    total: float = 0.0
    samples: int = 0


class UsageTracker:
    """Per-GPU utilisation accumulated between heartbeats (fed by every GpuSample)."""

    def __init__(self) -> None:
        self._usage: dict[str, _Usage] = {}

    def record(self, sample: GpuSample) -> None:
        if sample.utilization_ratio is None:
            return
        u = self._usage.get(sample.uuid)
        if u is None:
            u = self._usage[sample.uuid] = _Usage()
        u.total += min(1.0, max(0.0, sample.utilization_ratio))
        u.samples += 1

    def drain(self, allocations: tuple[Allocation, ...]) -> list[AllocationUsage]:
        usage, self._usage = self._usage, {}
        out: list[AllocationUsage] = []
        for a in allocations:
            u = usage.get(a.gpu_uuid)
            if u is None or u.samples == 0:
                continue
            out.append(
                AllocationUsage(
                    namespace=a.namespace,
                    pod=a.pod,
                    container=a.container,
                    gpu_uuid=a.gpu_uuid,
                    utilization_ratio=min(1.0, u.total / u.samples),
                    samples=u.samples,
                    attribution="gpu",
                )
            )
        return out


def telemetry(sample: GpuSample, throttle_reasons: frozenset[str]) -> GpuTelemetry:
    def ratio(v: float | None) -> float | None:
        return None if v is None else min(1.0, max(0.0, v))

    return GpuTelemetry(
        uuid=sample.uuid,
        temperature_c=sample.temperature_c,
        slowdown_temperature_c=sample.slowdown_temperature_c,
        shutdown_temperature_c=sample.shutdown_temperature_c,
        power_w=sample.power_w,
        utilization_ratio=ratio(sample.utilization_ratio),
        memory_bandwidth_ratio=ratio(sample.memory_utilization_ratio),
        sbe_recent=sample.ecc_sbe_volatile,
        throttled=bool(sample.throttle_reasons and sample.throttle_reasons & throttle_reasons),
    )


class StreamView:
    """Implements :class:`agent.stream.client.AgentStateProvider` from the cached snapshot."""

    def __init__(
        self,
        state: NodeState,
        usage: UsageTracker,
        *,
        version: str,
        throttle_reasons: frozenset[str],
        expected_gpus: int | None = None,
        boot_id: str | None = None,
    ) -> None:
        self._state = state
        self._usage = usage
        self._version = version
        self._throttle = throttle_reasons
        self._expected = expected_gpus
        self._boot_id = boot_id if boot_id is not None else read_boot_id()

    def hello_info(self) -> HelloInfo:
        snap = self._state.snapshot()
        return HelloInfo(
            node=self._state.node,
            boot_id=self._boot_id,
            agent_version=self._version,
            gpus=[s.info for s in snap.statuses],
            expected_gpus=self._expected,
        )

    def snapshot(self) -> tuple[list[GpuStatus], list[Allocation]]:
        snap = self._state.snapshot()
        return list(snap.statuses), list(snap.allocations)

    def heartbeat(self) -> tuple[list[AllocationUsage], list[GpuTelemetry]]:
        snap = self._state.snapshot()
        usage = self._usage.drain(snap.allocations)
        tele = [telemetry(snap.samples[s.info.uuid], self._throttle) for s in snap.statuses
                if s.info.uuid in snap.samples]  # fmt: skip
        return usage, tele
