"""The status page's JSON and its recent-event log, over a real Fleet, breaker and idle tracker."""

from __future__ import annotations

from typing import Any

from gpuhealth.common.clock import FakeClock
from gpuhealth.controller.breaker import CircuitBreaker
from gpuhealth.controller.config import BreakerSettings
from gpuhealth.controller.fleet import Fleet
from gpuhealth.controller.idle import IdleConfig
from gpuhealth.controller.idle_tracker import IdleTracker
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.status_page.activity import ActivityLog
from gpuhealth.controller.status_page.overview import build_overview, natural_key
from gpuhealth.controller.status_page.page import StatusPage
from gpuhealth.protocol import AllocationUsage
from tests.support.fleet import connect, send_transition
from tests.support.protocol import HOT, XID79, gpu_uuid

PREFIX = "gpuhealth.io"
TAINT = {"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
FOREIGN = {"key": "example.com/maintenance", "value": "", "effect": "NoSchedule"}


class Nodes:
    """Stands in for the node watch cache: views plus listeners (no API server involved)."""

    def __init__(self) -> None:
        self._views: dict[str, NodeView] = {}
        self._listeners: list[Any] = []

    def views(self) -> list[NodeView]:
        return list(self._views.values())

    def subscribe(self, listener: Any) -> None:
        self._listeners.append(listener)

    def set(self, name: str, *taints: dict[str, str], gpus: int = 8) -> None:
        old = self._views.get(name)
        new = NodeView(
            name=name, resource_version=str(len(self._views) + 1), taints=taints, gpus=gpus
        )
        self._views[name] = new
        for listener in self._listeners:
            listener("modified" if old else "added", old, new)


def test_natural_order() -> None:
    names = ["gpu-node-10", "gpu-node-2", "gpu-node-1"]
    assert sorted(names, key=natural_key) == ["gpu-node-1", "gpu-node-2", "gpu-node-10"]


def test_overview_lists_nodes_gpus_taints_and_counts() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = Nodes()
    for i in (10, 2):
        connect(fleet, f"gpu-node-{i}", 4)
    nodes.set("gpu-node-2", TAINT, FOREIGN)
    nodes.set("gpu-node-7")  # a GPU node no agent reported for
    nodes.set("cpu-node", gpus=0)  # not a GPU node: left out
    send_transition(fleet, "gpu-node-2", 3, "unhealthy", XID79)
    send_transition(fleet, "gpu-node-10", 1, "degraded", HOT)

    doc = build_overview(fleet, prefix=PREFIX, now=clock.now(), views=nodes.views())

    assert [n["name"] for n in doc["nodes"]] == ["gpu-node-2", "gpu-node-7", "gpu-node-10"]
    n2, n7, n10 = doc["nodes"]
    assert n2["state"] == "unhealthy" and n2["taints"] == [f"{PREFIX}/unhealthy=xid-79:NoSchedule"]
    assert n2["other_taints"] == ["example.com/maintenance=:NoSchedule"]
    gpu3 = n2["gpus"][3]
    assert gpu3["state"] == "unhealthy" and gpu3["conditions"][0]["xid"] == 79
    assert "GPU has fallen off the bus" in gpu3["summary"] and "RESTART_BM" in gpu3["summary"]
    assert n7 == {**n7, "state": "unknown", "gpus": [], "connected": False}
    assert n10["gpus"][1]["state"] == "degraded"
    assert doc["summary"]["nodes_by_state"] == {
        "healthy": 0,
        "degraded": 1,
        "unknown": 1,
        "unhealthy": 1,
    }
    assert doc["summary"]["gpus_by_state"]["unhealthy"] == 1
    assert doc["summary"]["tainted_nodes"] == 1
    assert doc["breaker"] is None and doc["idle"] is None


def test_event_log_records_gpu_changes_agents_and_taints_newest_first() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = Nodes()
    log = ActivityLog(PREFIX, clock=clock)
    log.attach_fleet(fleet)
    log.attach_nodes(nodes)
    connect(fleet, "n0", 8, state="unknown")  # an agent's first snapshot, before any sample
    clock.advance(1)
    send_transition(fleet, "n0", 3, "healthy")  # not reported yet -> healthy: no news
    send_transition(fleet, "n0", 3, "unhealthy", XID79)
    nodes.set("n0", TAINT, FOREIGN)
    nodes.set("n0", FOREIGN)
    send_transition(fleet, "n0", 3, "healthy")

    got = [(e.kind, e.severity, e.message) for e in log.recent()]
    assert got == [
        ("gpu", "info", "GPU 3: unhealthy -> healthy"),
        ("untaint", "info", f"untainted {PREFIX}/unhealthy=xid-79:NoSchedule"),
        ("taint", "error", f"tainted {PREFIX}/unhealthy=xid-79:NoSchedule"),
        ("gpu", "error", "GPU 3: healthy -> unhealthy: XidError xid-79 (GPU has fallen off the "
                         "bus), action RESTART_BM"),
        ("agent", "info", "agent connected"),
    ]  # fmt: skip


def test_event_log_is_bounded() -> None:
    log = ActivityLog(PREFIX, capacity=3, clock=FakeClock())
    for i in range(5):
        log.note("n", "gpu", "info", str(i))
    assert [e.message for e in log.recent()] == ["4", "3", "2"]
    assert [e.message for e in log.recent(1)] == ["4"]


async def test_page_reports_breaker_and_idle_and_logs_their_changes() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=1), clock)
    idle = IdleTracker(IdleConfig(window_s=10, evaluate_interval_s=1), clock=clock)
    idle.attach(fleet)
    page = StatusPage(fleet=fleet, breaker=breaker, idle=idle, clock=clock)
    connect(fleet, "n0", 8)

    def heartbeat() -> None:
        usage = AllocationUsage(
            namespace="ml", pod="nb", container="main", gpu_uuid=gpu_uuid(6, "n0"),
            utilization_ratio=0.0,
        )  # fmt: skip
        idle.observe("n0", [usage], {gpu_uuid(6, "n0"): "6"})

    heartbeat()
    for _ in range(3):
        clock.advance(6)
        heartbeat()
    idle.evaluate()
    breaker.request("n0", 8)
    breaker.request("n1", 8)  # over the limit of 1: trips

    doc: dict[str, Any] = page.overview()

    assert doc["breaker"]["open"] is True and doc["breaker"]["blocked_nodes"] == ["n1"]
    assert [(a["pod"], a["gpu"]) for a in doc["idle"]] == [("nb", "6")]
    assert doc["summary"]["idle_allocations"] == 1
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds[:2] == ["idle", "breaker"]
    page.overview()
    assert [e["kind"] for e in page.overview()["events"]].count("idle") == 1  # logged once


def test_silent_agent_and_removed_node_are_logged_and_shown_unknown() -> None:
    from gpuhealth.controller.config import FleetSettings

    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=10), clock=clock)
    log = ActivityLog(PREFIX, clock=clock)
    log.attach_fleet(fleet)
    connect(fleet, "n0", 8)
    connect(fleet, "n1", 8)
    clock.advance(11)
    assert sorted(fleet.check_silent()) == ["n0", "n1"]
    doc = build_overview(fleet, prefix=PREFIX, now=clock.now())
    assert {n["state"] for n in doc["nodes"]} == {"unknown"}
    assert doc["summary"]["gpus_by_state"]["unknown"] == 16
    fleet.forget("n1")
    messages = [(e.node, e.message) for e in log.recent(3)]
    assert messages == [
        ("n1", "node removed"),
        ("n1", "agent silent: node state unknown"),
        ("n0", "agent silent: node state unknown"),
    ]


def test_overview_is_built_at_most_once_per_cache_period() -> None:
    import json

    clock = FakeClock()
    fleet = Fleet(clock=clock)
    page = StatusPage(fleet=fleet, clock=clock, cache_s=1.0)
    connect(fleet, "n0", 8)
    first = page.overview_json()
    send_transition(fleet, "n0", 3, "unhealthy", XID79)
    assert page.overview_json() is first  # shared by every page polling within the period
    clock.advance(1.0)
    doc = json.loads(page.overview_json())
    assert doc["nodes"][0]["gpus"][3]["state"] == "unhealthy"
