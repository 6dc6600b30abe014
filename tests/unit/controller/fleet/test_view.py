"""The one fleet model: which nodes are listed, in which order, in which state, and the counts
that /api/v1/fleet, /api/v1/overview and the gpuhealth_nodes/gpus gauges all report."""

from __future__ import annotations

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.fleet.view import build_fleet_view, natural_key, taint_text
from gpuhealth.controller.names import Keys
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import HOT, XID79, snapshot

K = Keys("gpuhealth.io")
OURS = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
FOREIGN = {"key": "example.com/maintenance", "value": "", "effect": "NoSchedule"}


def test_natural_order() -> None:
    names = ["gpu-node-10", "gpu-node-2", "gpu-node-1"]
    assert sorted(names, key=natural_key) == ["gpu-node-1", "gpu-node-2", "gpu-node-10"]


def test_nodes_states_taints_and_counts() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=10), clock)
    nodes = FakeNodeCache()
    connect(fleet, "gpu-node-10", 4)
    connect(fleet, "gpu-node-2", 4)
    connect(fleet, "gpu-node-3", 2)
    nodes.set("gpu-node-2", OURS, FOREIGN, labels={K.exclude_label: "true"})
    nodes.set("gpu-node-7")  # a GPU node no agent reported for
    nodes.set("cpu-node", gpus=0)  # not a GPU node, no agent: not listed
    clock.advance(5)
    connect(fleet, "gpu-node-11", 1)  # keeps talking while gpu-node-3 goes silent
    clock.advance(6)
    assert fleet.check_silent() == ["gpu-node-10", "gpu-node-2", "gpu-node-3"]
    connect(fleet, "gpu-node-10", 4)  # these two speak again; gpu-node-3 stays silent
    connect(fleet, "gpu-node-2", 4)
    send_transition(fleet, "gpu-node-2", 3, "unhealthy", XID79)
    send_transition(fleet, "gpu-node-10", 1, "degraded", HOT)
    send_transition(fleet, "gpu-node-10", 2, "unknown")

    view = build_fleet_view(fleet, nodes.views(), K)

    names = [n.name for n in view.nodes]
    assert names == ["gpu-node-2", "gpu-node-3", "gpu-node-7", "gpu-node-10", "gpu-node-11"]
    by_name = {n.name: n for n in view.nodes}
    n2, n3, n7, n10 = (
        by_name[n] for n in ("gpu-node-2", "gpu-node-3", "gpu-node-7", "gpu-node-10")
    )
    assert n2.state == "unhealthy" and n2.excluded and n2.node is not None
    assert [taint_text(t) for t in n2.ours] == ["gpuhealth.io/unhealthy=xid-79:NoSchedule"]
    assert [taint_text(t) for t in n2.foreign] == ["example.com/maintenance=:NoSchedule"]
    assert n3.state == "unknown" and n3.silent and n3.node is None  # silent agent
    assert n7.state == "unknown" and n7.agent is None and n7.gpus == []  # no agent
    assert n10.state == "unknown"  # an unknown GPU outranks a degraded one
    assert [g.info.index for g in n10.gpus] == [0, 1, 2, 3]

    counts = view.counts()
    assert list(counts.nodes) == ["healthy", "degraded", "unknown", "unhealthy"]
    assert counts.nodes == {"healthy": 1, "degraded": 0, "unknown": 3, "unhealthy": 1}
    # gpu-node-3's GPUs count as unknown while its agent is silent
    assert counts.gpus == {"healthy": 6, "degraded": 1, "unknown": 3, "unhealthy": 1}
    assert view.gpu_count() == sum(counts.gpus.values()) == 11


def test_a_node_deleted_from_the_cluster_stays_while_its_agent_reports() -> None:
    fleet = Fleet(clock=FakeClock())
    connect(fleet, "gpu-node-1", 1)
    [n] = build_fleet_view(fleet, (), K).nodes
    assert n.name == "gpu-node-1" and n.node is None and n.state == "healthy"
    assert n.ours == () and not n.excluded and n.condition is None


def test_silent_agent_counts_every_gpu_unknown() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=30), clock)
    connect(fleet, "n1", 2)
    clock.advance(31)
    assert fleet.check_silent() == ["n1"]
    counts = build_fleet_view(fleet, (), K).counts()
    assert counts.nodes["unknown"] == 1 and counts.gpus["unknown"] == 2


def test_counts() -> None:
    fleet = Fleet(clock=FakeClock())
    fleet.on_message("n1", snapshot("n1", faults={1: XID79}))
    fleet.on_message("n2", snapshot("n2"))
    counts = build_fleet_view(fleet, (), K).counts()
    assert counts.nodes == {"healthy": 1, "degraded": 0, "unknown": 0, "unhealthy": 1}
    assert counts.gpus["healthy"] == 3 and counts.gpus["unhealthy"] == 1
