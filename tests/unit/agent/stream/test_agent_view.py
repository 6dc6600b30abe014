"""What the stream client reads from the agent: Hello, snapshots, heartbeats."""

from __future__ import annotations

import msgspec
import pytest

from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.stream.agent_view import SnapshotAgentView
from gpuhealth.agent.usage import UsageAccumulator
from gpuhealth.protocol import GpuTelemetry
from tests.support.agent import AT, alloc, engine_with, full_sample, uuid
from tests.support.clock import FakeClock


def test_usage_and_heartbeat() -> None:
    engine = engine_with(2)
    engine.stat = [
        msgspec.structs.replace(s, telemetry=GpuTelemetry(uuid=s.info.uuid, temperature_c=40.0))
        for s in engine.stat
    ]
    state = NodeSnapshotCache("n", engine, FakeClock())  # type: ignore[arg-type]
    state.set_allocations([alloc(0, "train")])
    usage = UsageAccumulator()
    view = SnapshotAgentView(state, usage, version="v", boot_id="b")
    for ratio in (0.2, 0.4):
        usage.record(full_sample(0).__class__(uuid=uuid(0), at=AT, utilization_ratio=ratio))
    usage.record(full_sample(1))
    got, tele = view.heartbeat()
    assert [(u.pod, u.samples, u.attribution) for u in got] == [("train", 2, "gpu")]
    assert got[0].utilization_ratio == pytest.approx(0.3)
    assert [t.uuid for t in tele] == [uuid(0), uuid(1)]
    assert tele[0].throttled is False and tele[0].temperature_c == 40.0
    assert view.heartbeat()[0] == []  # drained
    gpus, allocations = view.snapshot()
    assert len(gpus) == 2 and [a.pod for a in allocations] == ["train"]
    hello = view.hello_info()
    assert hello.node == "n" and [g.index for g in hello.gpus] == [0, 1]
