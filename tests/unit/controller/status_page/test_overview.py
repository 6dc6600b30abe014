"""The status page's JSON (/api/v1/overview) from the fleet view: compact nodes, GPUs, taints,
counts, and the activity log of a silent agent."""

from __future__ import annotations

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.names import Keys
from gpuhealth.controller.status_page import StatusPage
from gpuhealth.controller.status_page.activity import ActivityLog
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import HOT, XID79

KEYS = Keys()
PREFIX = KEYS.prefix
TAINT = {"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
FOREIGN = {"key": "example.com/maintenance", "value": "", "effect": "NoSchedule"}


def test_overview_lists_nodes_gpus_taints_and_counts() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = FakeNodeCache()
    for i in (10, 2):
        connect(fleet, f"gpu-node-{i}", 4)
    nodes.set("gpu-node-2", TAINT, FOREIGN)
    nodes.set("gpu-node-7")  # a GPU node no agent reported for
    nodes.set("cpu-node", gpus=0)  # not a GPU node: left out
    send_transition(fleet, "gpu-node-2", 3, "unhealthy", XID79)
    send_transition(fleet, "gpu-node-10", 1, "degraded", HOT)

    doc = StatusPage(fleet=fleet, keys=KEYS, nodes=nodes, clock=clock).overview()

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


def test_silent_agent_and_removed_node_are_logged_and_shown_unknown() -> None:
    from gpuhealth.controller.fleet.settings import FleetSettings

    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=10), clock=clock)
    log = ActivityLog(KEYS, clock=clock)
    log.attach_fleet(fleet)
    connect(fleet, "n0", 8)
    connect(fleet, "n1", 8)
    clock.advance(11)
    assert sorted(fleet.check_silent()) == ["n0", "n1"]
    doc = StatusPage(fleet=fleet, keys=KEYS, clock=clock).overview()
    assert {n["state"] for n in doc["nodes"]} == {"unknown"}
    assert doc["summary"]["gpus_by_state"]["unknown"] == 16
    fleet.forget("n1")
    messages = [(e.node, e.message) for e in log.recent(3)]
    assert messages == [
        ("n1", "node removed"),
        ("n1", "agent silent: node state unknown"),
        ("n0", "agent silent: node state unknown"),
    ]
