"""IdleTracker: windows from heartbeats (through the real Fleet), metrics, pod writes."""

from __future__ import annotations

import asyncio
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest

from gpuhealth.common.errors import TransientError
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.idle import IdleSettings, NamespaceIdleSettings
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.protocol import AllocationUsage, Heartbeat, Snapshot
from tests.support.clock import FakeClock
from tests.support.protocol import allocation, gpu_status, heartbeat, hello, snapshot

HB_S = 10.0


class RecordingWriter:
    """Our own PodWriter interface, recording calls (the real one is tested against the API)."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[str, str, str, str]] = []
        self.annotations: list[tuple[str, str, str, str | None]] = []
        self.fail = fail

    async def create_event(
        self, namespace: str, pod: str, reason: str, message: str, now: datetime
    ) -> bool:
        if self.fail:
            raise TransientError("apiserver down")
        self.events.append((namespace, pod, reason, message))
        return True

    async def set_annotation(self, namespace: str, pod: str, key: str, value: str | None) -> bool:
        self.annotations.append((namespace, pod, key, value))
        return True


def usage(pod: str, ratio: float, ns: str = "team", gpu: str = "GPU-0") -> AllocationUsage:
    return AllocationUsage(
        namespace=ns, pod=pod, container="main", gpu_uuid=gpu, utilization_ratio=ratio
    )


class World:
    def __init__(self, cfg: IdleSettings, writer: RecordingWriter | None = None) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(FleetSettings(), self.clock)
        self.writer = writer or RecordingWriter()
        self.tracker = IdleTracker(cfg, self.clock, self.writer)
        self.tracker.attach(self.fleet)
        self.fleet.on_connect("node-1", hello("node-1", 0))
        allocs = [allocation("GPU-3", namespace="team", container="main", device_id="x")]
        self.send(snapshot("node-1", [gpu_status(0), gpu_status(3)], allocations=allocs))

    def send(self, msg: Snapshot | Heartbeat) -> None:
        self.fleet.on_message("node-1", msg)

    def heartbeats(self, seconds: float, *u: AllocationUsage) -> None:
        for _ in range(int(seconds // HB_S)):
            self.clock.advance(HB_S)
            self.send(heartbeat("node-1", usage=u))


CFG = IdleSettings(window_s=600, max_gap_s=60, stale_after_s=120)


async def test_idle_allocation_gets_metric_event_once_per_window_and_annotation() -> None:
    w = World(IdleSettings(window_s=600, max_gap_s=60, annotate=True))
    w.heartbeats(590, usage("idle", 0.01, gpu="GPU-3"), usage("busy", 0.6))
    assert w.tracker.evaluate() == []
    w.heartbeats(20, usage("idle", 0.01, gpu="GPU-3"), usage("busy", 0.6))
    w.tracker.evaluate()
    [a] = w.tracker.idle_allocations()
    assert (a.pod, a.node, a.gpu, a.uuid, a.attribution) == ("idle", "node-1", "3", "GPU-3", "gpu")
    assert await w.tracker.flush() == 2
    assert [e[1:3] for e in w.writer.events] == [("idle", "GPUIdle")]
    assert "GPU 3" in w.writer.events[0][3]
    assert w.writer.annotations[0][:3] == ("team", "idle", "gpuhealth.io/idle-since")

    reg = CollectorRegistry()
    reg.register(w.tracker.collector())
    text = generate_latest(reg).decode()
    assert (
        'gpuhealth_idle_allocation{attribution="gpu",container="main",gpu="3",'
        'namespace="team",node="node-1",pod="idle",uuid="GPU-3"} 1.0'
    ) in text
    assert "gpuhealth_idle_allocation_duration_seconds{" in text

    # still idle, within the same window: no second Event
    w.heartbeats(300, usage("idle", 0.0, gpu="GPU-3"))
    w.tracker.evaluate()
    await w.tracker.flush()
    assert len(w.writer.events) == 1
    # a further full window: one more
    w.heartbeats(300, usage("idle", 0.0, gpu="GPU-3"))
    w.tracker.evaluate()
    await w.tracker.flush()
    assert len(w.writer.events) == 2

    # busy again: metric gone, annotation removed
    w.heartbeats(10, usage("idle", 0.9, gpu="GPU-3"))
    assert w.tracker.evaluate() == []
    await w.tracker.flush()
    assert w.writer.annotations[-1][3] is None
    assert "gpuhealth_idle_allocation{" not in generate_latest(reg).decode()


async def test_exempt_namespace_and_override_threshold() -> None:
    cfg = IdleSettings(
        window_s=600,
        exempt_namespaces=["kube-system"],
        namespaces={"lenient": NamespaceIdleSettings(threshold_ratio=0.2)},
    )
    w = World(cfg)
    w.heartbeats(
        700,
        usage("sys", 0.0, ns="kube-system"),
        usage("low", 0.1, ns="lenient"),
        usage("low", 0.1, ns="strict"),
    )
    w.tracker.evaluate()
    assert {(a.namespace, a.pod) for a in w.tracker.idle_allocations()} == {("lenient", "low")}


async def test_stale_allocations_are_forgotten_and_memory_is_capped() -> None:
    w = World(IdleSettings(window_s=600, max_gap_s=60, stale_after_s=120, max_allocations=2))
    w.heartbeats(10, usage("a", 0.0), usage("b", 0.0), usage("c", 0.0))
    assert len(w.tracker) == 2
    assert w.tracker.dropped == 1
    w.clock.advance(121)
    w.tracker.evaluate()
    assert len(w.tracker) == 0


async def test_pod_that_started_recently_is_not_idle() -> None:
    w = World(CFG)
    w.heartbeats(300, usage("new", 0.0))
    assert w.tracker.evaluate() == []


async def test_removed_node_is_forgotten() -> None:
    w = World(CFG)
    w.heartbeats(20, usage("a", 0.0))
    w.fleet.forget("node-1")
    assert len(w.tracker) == 0


async def test_write_errors_are_counted_not_raised_and_followers_do_not_write() -> None:
    w = World(CFG, RecordingWriter(fail=True))
    w.heartbeats(700, usage("a", 0.0))
    w.tracker.evaluate()
    assert await w.tracker.flush() == 0
    assert w.tracker.write_errors == 1

    follower = IdleTracker(CFG, w.clock, RecordingWriter(), should_act=lambda: False)
    follower.attach(w.fleet)
    w.heartbeats(700, usage("a", 0.0))
    assert len(follower.evaluate()) == 1
    assert await follower.flush() == 0


async def test_run_loop_evaluates_on_the_interval() -> None:
    w = World(IdleSettings(window_s=600, max_gap_s=60, evaluate_interval_s=30))
    w.heartbeats(700, usage("a", 0.0))
    task = asyncio.create_task(w.tracker.run(), name="idle-test")
    await w.clock.advance_and_settle(0)
    await w.clock.advance_and_settle(30)
    assert len(w.tracker.idle) == 1
    assert len(w.writer.events) == 1
    task.cancel()


async def test_same_pod_name_on_another_node_starts_a_new_window() -> None:
    w = World(CFG)
    w.heartbeats(700, usage("sts-0", 0.0))
    w.tracker.observe("node-2", [usage("sts-0", 0.0)], {})
    w.tracker.evaluate()
    assert w.tracker.idle == []
    assert len(w.tracker) == 1
    w.fleet.forget("node-1")  # the old node's index no longer holds it
    assert len(w.tracker) == 1
