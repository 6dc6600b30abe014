"""The agent's stream client without a server: heartbeat queueing, Event mapping, validation
before queueing (with a controller: tests/unit/controller/stream/test_server.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.clock import FakeClock


async def test_heartbeats_queued_on_the_injected_clock(tmp_path: Path) -> None:
    import asyncio

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Heartbeat, decode
    from tests.support.stream import FakeAgentState

    clock = FakeClock()
    c = StreamClient(
        StreamClientSettings(heartbeat_interval_s=10.0),
        FakeAgentState("node-a"),
        Outbox(tmp_path),
        lambda: "t",
        clock=clock,
    )
    task = asyncio.create_task(c.run_heartbeats())
    try:
        await clock.advance_and_settle(0)  # let the task start sleeping
        await clock.advance_and_settle(9.9)
        assert len(c.outbox) == 0
        await clock.advance_and_settle(0.2)
        await clock.advance_and_settle(10.5)
        beats = [decode(e.frame) for e in c.outbox.entries()]
        assert [type(b) for b in beats] == [Heartbeat, Heartbeat]
        assert [b.seq for b in beats] == [1, 2]  # type: ignore[union-attr]
        assert beats[0].node == "node-a" and len(beats[0].telemetry) == 2  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        c.outbox.close()


def test_a_snapshot_carries_the_node_conditions(tmp_path: Path) -> None:
    import dataclasses

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Condition, Snapshot, decode
    from tests.support.stream import FakeAgentState

    missing = Condition(
        reason="GpuMissing", code="gpu-missing", severity="unhealthy", message="7 of 8"
    )

    @dataclasses.dataclass
    class MissingOne(FakeAgentState):
        def node_conditions(self) -> list[Condition]:
            return [missing]

    c = StreamClient(StreamClientSettings(), MissingOne("node-a", 7), Outbox(tmp_path), str)
    c.queue_snapshot()
    (snap,) = [decode(e.frame) for e in c.outbox.entries()]
    assert isinstance(snap, Snapshot)
    assert len(snap.gpus) == 7 and snap.node_conditions == [missing]
    c.outbox.close()


def test_a_snapshot_carries_the_nic_ports(tmp_path: Path) -> None:
    """What the node snapshot knows of a port reaches the wire: the GPUs behind it by UUID and
    the codes of its verdicts (each GPU carries the whole condition)."""
    from gpuhealth.agent.node_snapshot import NodeSnapshotCache
    from gpuhealth.agent.stream.agent_view import SnapshotAgentView
    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.agent.usage import UsageAccumulator
    from gpuhealth.protocol import Snapshot, decode
    from tests.support.agent import AT, engine_with, rail, uuid

    engine = engine_with(2)
    engine.nics = [rail()]
    view = SnapshotAgentView(
        NodeSnapshotCache("node-a", engine, FakeClock()),  # type: ignore[arg-type]
        UsageAccumulator(),
        version="t",
        boot_id="b",
    )
    c = StreamClient(StreamClientSettings(), view, Outbox(tmp_path), str)
    c.queue_snapshot()
    (snap,) = [decode(e.frame) for e in c.outbox.entries()]
    assert isinstance(snap, Snapshot)
    (nic,) = snap.nics
    assert (nic.device, nic.port, nic.link_layer, nic.port_state, nic.phys_state) == (
        "mlx5_0", 1, "InfiniBand", "ACTIVE", "LinkUp"
    )  # fmt: skip
    assert nic.gpus == [uuid(0), uuid(1)] and nic.affinity == "PIX"
    assert (nic.rate_gbps, nic.expected_rate_gbps, nic.flaps, nic.last_flap) == (400, 400, 2, AT)
    assert nic.verdicts == ["rail-flapping"] and nic.model == "MT4129" and nic.netdev == "ib0"
    c.outbox.close()


def test_event_from_transition_maps_every_field() -> None:
    from gpuhealth.agent.stream.client import event_from_transition
    from tests.support.stream import transition

    t = transition(79, gpu=3)
    e = event_from_transition(12, "node-a", t)
    assert (e.seq, e.node, e.gpu_uuid, e.gpu_index, e.kind) == (
        12,
        "node-a",
        "GPU-3",
        3,
        "transition",
    )
    assert (e.previous, e.current, e.xid, e.at) == (t.previous, t.current, 79, t.at)


def test_a_message_the_controller_would_reject_is_never_queued(tmp_path: Path) -> None:
    import dataclasses

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Condition
    from tests.support.stream import FakeAgentState, transition

    c = StreamClient(StreamClientSettings(), FakeAgentState("node-a"), Outbox(tmp_path), str)
    bad = Condition(reason="XidError", code="not a label value!", severity="unhealthy")
    c.publish(dataclasses.replace(transition(1), conditions=(bad,)))
    c.publish(transition(2))
    assert c.metrics.dropped["invalid"] == 1
    from gpuhealth.protocol import decode

    queued = [decode(e.frame) for e in c.outbox.entries()]
    assert [(m.seq, m.xid) for m in queued] == [(1, 2)]  # type: ignore[union-attr]
    c.outbox.close()


def test_a_snapshot_says_when_the_allocations_are_unknown(tmp_path: Path) -> None:
    """Allocations unknown and no pods are two states on the wire."""
    from gpuhealth.agent.node_snapshot import NodeSnapshotCache
    from gpuhealth.agent.stream.agent_view import SnapshotAgentView
    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.agent.usage import UsageAccumulator
    from gpuhealth.protocol import Snapshot, decode
    from tests.support.agent import engine_with

    state = NodeSnapshotCache("node-a", engine_with(1), FakeClock())  # type: ignore[arg-type]
    view = SnapshotAgentView(state, UsageAccumulator(), version="t", boot_id="b")
    c = StreamClient(StreamClientSettings(), view, Outbox(tmp_path), str)
    assert state.set_allocations_unknown("PodResources: socket missing")
    assert not state.set_allocations_unknown("PodResources: socket missing")
    c.queue_snapshot()
    unknown = decode(c.outbox.entries()[-1].frame)
    assert state.set_allocations_unknown(None)
    c.queue_snapshot()
    known = decode(c.outbox.entries()[-1].frame)
    assert isinstance(unknown, Snapshot) and isinstance(known, Snapshot)
    assert unknown.allocations_unknown == "PodResources: socket missing"
    assert known.allocations_unknown is None and known.allocations == []
    c.outbox.close()
