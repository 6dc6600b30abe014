"""Fleet state from protocol messages: snapshots, events, heartbeats, silence, notifications."""

from __future__ import annotations

import msgspec
import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.names import Keys
from gpuhealth.protocol import (
    AllocationUsage,
    Condition,
    Event,
    GpuTelemetry,
    HealthState,
    Heartbeat,
    Hello,
    MigDeviceInfo,
    Snapshot,
)
from tests.support import protocol as support
from tests.support.clock import FakeClock
from tests.support.protocol import T0, XID79, allocation, gpu_status, gpu_uuid


def hello(node: str = "n1") -> Hello:
    return support.hello(node, 2)


def snapshot(
    node: str = "n1", states: tuple[HealthState, ...] = ("healthy", "healthy"), seq: int = 2
) -> Snapshot:
    """Two GPUs in ``states`` (an unhealthy one for XID 79), one holding an allocation."""
    return support.snapshot(
        node,
        [
            gpu_status(i, s, *([XID79] if s == "unhealthy" else []), node=node)
            for i, s in enumerate(states)
        ],
        seq=seq,
        allocations=[allocation(gpu_uuid(0, node))],
    )


def transition(gpu: int, current: HealthState) -> Event:
    return support.transition("n1", gpu, current, *([XID79] if current == "unhealthy" else []))


def make() -> tuple[Fleet, FakeClock, list[tuple[str, str]]]:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=30), clock)
    seen: list[tuple[str, str]] = []
    fleet.subscribe(lambda n, k: seen.append((n, k)))
    return fleet, clock, seen


def test_no_data_until_first_snapshot() -> None:
    fleet, _, seen = make()
    assert fleet.node_health("nope").reporting == "no-data"
    fleet.on_connect("n1", hello())
    assert fleet.node_health("n1").reporting == "no-data"
    assert fleet.node("n1") is not None and fleet.node("n1").connected  # type: ignore[union-attr]
    fleet.on_message("n1", snapshot())
    h = fleet.node_health("n1")
    assert h.reporting == "ok"
    assert [g.state for g in h.gpus] == ["healthy", "healthy"]
    assert ("n1", "health") in seen and ("n1", "allocations") in seen


def test_missing_gpus_from_expected_count_and_from_the_agents_condition() -> None:
    fleet, _, seen = make()
    fleet.on_connect("n1", support.hello("n1", 2, expected_gpus=3))
    fleet.on_message("n1", snapshot())
    report = fleet.node_health("n1")
    assert report.gpus_missing == 1 and report.node_conditions == ()
    node = fleet.node("n1")
    assert node is not None and node.worst_state() == "unhealthy"

    # the agent's own verdict (expected_gpus unset: the count NVML gave at start)
    fleet.on_connect("n1", support.hello("n1", 2))
    said = Condition(
        reason="GpuMissing", code="gpu-missing", severity="unhealthy", message="2 of 3"
    )
    seen.clear()
    fleet.on_message("n1", msgspec.structs.replace(snapshot(seq=3), node_conditions=[said]))
    report = fleet.node_health("n1")
    assert report.gpus_missing == 1 and report.node_conditions == (said,)
    assert ("n1", "health") in seen
    seen.clear()
    fleet.on_message("n1", snapshot(seq=4))  # all visible again
    assert fleet.node_health("n1").gpus_missing == 0 and ("n1", "health") in seen


def test_event_updates_one_gpu_and_notifies() -> None:
    fleet, _, seen = make()
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot())
    seen.clear()
    fleet.on_message("n1", transition(1, "unhealthy"))
    assert seen == [("n1", "health")]
    h = fleet.node_health("n1")
    assert h.gpus[1].state == "unhealthy" and h.gpus[1].conditions == (XID79,)
    rec = fleet.node("n1")
    assert rec is not None and rec.worst_state() == "unhealthy"
    found = fleet.gpu(gpu_uuid(1, "n1"))
    assert found is not None and found[1].state == "unhealthy"


def test_same_snapshot_twice_notifies_once() -> None:
    fleet, _, seen = make()
    fleet.on_message("n1", snapshot())
    n = len(seen)
    fleet.on_message("n1", snapshot(seq=5))
    assert len(seen) == n


def test_mig_devices_of_a_snapshot_reach_the_report_and_survive_events() -> None:
    """GpuInfo.mig_devices (MIG UUID -> this parent) is what the DRA device taints fall back
    on; a new MIG layout is a health change (the device taints are planned again)."""
    fleet, _, seen = make()
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot())
    migs = [MigDeviceInfo(uuid="MIG-1a", gpu_instance_id=1, compute_instance_id=0)]
    base = snapshot(seq=3)
    gpu1 = base.gpus[1]
    with_mig = msgspec.structs.replace(
        gpu1, info=msgspec.structs.replace(gpu1.info, mig_enabled=True, mig_devices=migs)
    )
    seen.clear()
    fleet.on_message("n1", msgspec.structs.replace(base, gpus=[base.gpus[0], with_mig]))
    assert ("n1", "health") in seen
    assert fleet.node_health("n1").gpus[1].mig_devices == tuple(migs)
    assert fleet.node_health("n1").gpus[0].mig_devices == ()
    fleet.on_message("n1", transition(1, "unhealthy"))  # an Event keeps the GPU's info
    report = fleet.node_health("n1")
    assert report.gpus[1].state == "unhealthy" and report.gpus[1].mig_devices == tuple(migs)


def test_event_for_unknown_gpu_creates_it() -> None:
    fleet, _, _ = make()
    fleet.on_message("n1", transition(5, "unhealthy"))
    h = fleet.node_health("n1")
    assert h.reporting == "no-data"
    assert [g.uuid for g in h.gpus] == [gpu_uuid(5, "n1")]


def test_heartbeat_sets_telemetry_and_usage_without_health_change() -> None:
    fleet, _, seen = make()
    fleet.on_message("n1", snapshot())
    seen.clear()
    hb = Heartbeat(
        seq=9,
        node="n1",
        at=T0,
        telemetry=[GpuTelemetry(uuid=gpu_uuid(0, "n1"), temperature_c=70.0)],
        usage=[
            AllocationUsage(
                namespace="ns",
                pod="p",
                container="c",
                gpu_uuid=gpu_uuid(0, "n1"),
                utilization_ratio=0.01,
            )
        ],
    )
    usage: list[tuple[str, float]] = []
    fleet.subscribe_usage(lambda node, u: usage.extend((node, x.utilization_ratio) for x in u))
    fleet.on_message("n1", hb)
    assert seen == [("n1", "usage")]
    rec = fleet.node("n1")
    assert rec is not None
    assert rec.gpus[gpu_uuid(0, "n1")].telemetry is not None
    assert rec.gpus[gpu_uuid(0, "n1")].telemetry.temperature_c == 70.0
    assert usage == [("n1", 0.01)]  # handed over, not kept on the record
    assert rec.usage_at == hb.at


def test_silent_agent_goes_unknown_and_wakes() -> None:
    fleet, clock, seen = make()
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot())
    clock.advance(29)
    assert fleet.check_silent() == []
    clock.advance(2)
    seen.clear()
    assert fleet.check_silent() == ["n1"]
    assert seen == [("n1", "health")]
    assert fleet.node_health("n1").reporting == "silent"
    assert build_fleet_view(fleet, (), Keys()).counts().nodes["unknown"] == 1
    assert fleet.check_silent() == []
    fleet.on_message("n1", Heartbeat(seq=10, node="n1", at=T0))
    assert fleet.node_health("n1").reporting == "ok"
    assert ("n1", "health") in seen


@pytest.mark.parametrize(
    ("waits_at", "silent_at", "why"),
    [
        ((), 31, "never waited: silent after agent_timeout_s (30 s)"),
        ((20,), 51, "waited its turn at 20 s: quiet because of the controller until 50 s"),
        ((20, 45, 70), 101, "kept waiting: silence postponed by each wait"),
        ((20, 45, 70, 95, 120), 131, "but at most waiting_grace_s (100 s) past its last message"),
        ((29,), 60, "a wait just before the deadline moves it"),
    ],
)
def test_an_agent_waiting_for_admission_is_not_silent(
    waits_at: tuple[int, ...], silent_at: int, why: str
) -> None:
    """A node whose agent waits for its turn after a restart or failover (queued, or told to
    come back) does not flap to unknown; a forged Hello cannot keep it up for ever."""
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=30, waiting_grace_s=100), clock)
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot())
    pending = list(waits_at)
    for t in range(1, silent_at + 1):
        clock.advance(1)
        while pending and pending[0] <= t:
            pending.pop(0)
            fleet.agent_waiting("n1", 0.0)
        silent = fleet.check_silent()
        if silent:
            assert t == silent_at, why
            return
    raise AssertionError(f"never silent: {why}")


def test_an_agent_told_to_come_back_later_is_not_silent_until_then() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=30, waiting_grace_s=100), clock)
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot())
    clock.advance(10)
    fleet.agent_waiting("n1", 50.0)  # told to come back in 25 s, plus its jitter
    clock.advance(79.5)  # 89.5 s since its last message; expected back by 60 s
    assert fleet.check_silent() == []
    clock.advance(1.0)  # more than agent_timeout_s after the time it was expected back
    assert fleet.check_silent() == ["n1"]


def test_a_waiting_hello_for_an_unknown_node_creates_nothing() -> None:
    fleet, _, seen = make()
    fleet.agent_waiting("ghost", 10.0)
    assert fleet.node("ghost") is None and seen == []


def test_disconnect_and_forget() -> None:
    fleet, _, seen = make()
    fleet.on_connect("n1", hello())
    assert fleet.connected_count() == 1
    fleet.on_disconnect("n1")
    assert fleet.connected_count() == 0
    fleet.forget("n1")
    assert fleet.node("n1") is None and ("n1", "removed") in seen


def test_listener_error_is_contained() -> None:
    fleet, _, _ = make()

    def bad(node: str, kind: str) -> None:
        raise RuntimeError("boom")

    fleet.subscribe(bad)
    fleet.on_message("n1", snapshot())
    assert fleet.node_health("n1").reporting == "ok"


def test_names_repeated_across_the_fleet_are_kept_once() -> None:
    """Decoded from the wire every GPU carries its own copy of its model name and every
    allocation its own namespace, container and UUID: the fleet keeps one string per value."""
    from gpuhealth.protocol.codec import decode_agent, encode

    fleet, _clock, _seen = make()
    for node in ("n1", "n2"):
        fleet.on_connect(node, hello(node))
        snap = support.snapshot(
            node, allocations=[allocation(gpu_uuid(i, node), f"pod-{i}") for i in range(2)]
        )
        fleet.on_message(node, decode_agent(encode(snap)))  # fresh strings, as from a socket
    n1, n2 = fleet.node("n1"), fleet.node("n2")
    assert n1 is not None and n2 is not None
    g1, g2 = n1.gpus_by_index()
    assert g1.info.model is g2.info.model is n2.gpus_by_index()[0].info.model
    a = n1.allocations[0]
    assert a.gpu_uuid is n1.gpus[a.gpu_uuid].info.uuid
    assert a.namespace is n2.allocations[1].namespace
    assert a.container is n2.allocations[1].container


def test_records_with_nothing_share_one_empty_list() -> None:
    """Empty conditions, MIG devices, node conditions and allocations are the one shared
    empty list (a list each cost 72 bytes and a collected object, 16 per node); a record with
    something keeps its own, and a GPU whose conditions clear goes back to the shared one."""
    from gpuhealth.controller.fleet.model import NOTHING

    fleet, _, _ = make()
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot(states=("healthy", "unhealthy")))
    rec = fleet.node("n1")
    assert rec is not None
    healthy, unhealthy = (rec.gpus[gpu_uuid(i, "n1")] for i in range(2))
    assert healthy.conditions is NOTHING and healthy.info.mig_devices is NOTHING
    assert unhealthy.conditions == [XID79] and unhealthy.conditions is not NOTHING
    assert rec.node_conditions is NOTHING
    assert rec.allocations is not NOTHING and len(rec.allocations) == 1
    fleet.on_message("n1", transition(1, "healthy"))
    assert rec.gpus[gpu_uuid(1, "n1")].conditions is NOTHING
    fleet.on_message("n1", support.snapshot("n1", [gpu_status(0, "healthy", node="n1")], seq=4))
    assert rec.allocations is NOTHING
    assert NOTHING == []  # never written to


def test_gpu_records_are_not_walked_by_the_garbage_collector() -> None:
    """A GPU's record and its identity (8 per node) are untracked: a full collection at
    19,000 nodes walked 1.15 million objects, a quarter of them these two."""
    import gc

    fleet, _, _ = make()
    fleet.on_connect("n1", hello())
    fleet.on_message("n1", snapshot(states=("healthy", "unhealthy")))
    fleet.on_message("n1", transition(1, "healthy"))
    rec = fleet.node("n1")
    assert rec is not None and len(rec.gpus) == 2
    for gpu in rec.gpus.values():
        assert not gc.is_tracked(gpu) and not gc.is_tracked(gpu.info)
    assert gc.is_tracked(rec)  # the node's record is walked: it holds a dict of them


def test_pods_that_newly_hold_a_gpu_are_counted_but_not_a_nodes_first_report() -> None:
    """``gpu_pods_started`` (the extender silence alert's evidence that GPU pods are being
    placed): a pod new on a node counts once, whatever GPUs or containers it holds; the pods a
    node already ran when it first reported to this controller do not."""
    from gpuhealth.protocol import Allocation
    from tests.support.protocol import gpu_uuid, hello, snapshot

    def held(*pods: tuple[str, int]) -> list[Allocation]:
        return [
            Allocation(
                namespace="ml",
                pod=pod,
                container="c",
                gpu_uuid=gpu_uuid(gpu, "n1"),
                device_id=gpu_uuid(gpu, "n1"),
            )
            for pod, gpu in pods
        ]

    fleet = Fleet()
    fleet.on_connect("n1", hello("n1", 4))
    fleet.on_message("n1", snapshot("n1", 4, allocations=held(("old", 0))))
    assert fleet.gpu_pods_started == 0  # running before this controller saw the node
    fleet.on_message("n1", snapshot("n1", 4, allocations=held(("old", 0), ("a", 1), ("a", 2))))
    assert fleet.gpu_pods_started == 1
    fleet.on_message("n1", snapshot("n1", 4, allocations=held(("a", 1), ("b", 3))))
    assert fleet.gpu_pods_started == 2
    fleet.on_connect("n1", hello("n1", 4))  # a reconnect: the same pods are not new
    fleet.on_message("n1", snapshot("n1", 4, allocations=held(("a", 1), ("b", 3))))
    assert fleet.gpu_pods_started == 2
