"""/api/v1/fleet and /api/v1/breaker as JSON, and their agreement with the status page's
/api/v1/overview: one fleet view, so the same nodes in the same order, states and counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.http.api import ApiV1, breaker_json, fleet_json, node_fragment
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.model import Episode, Fault, Phase, PhaseTimes, Spec, Status
from gpuhealth.controller.status_page import StatusPage
from gpuhealth.controller.status_page.overview import build_overview
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import HOT, XID79, gpu_uuid, nic, snapshot

K = Keys("gpuhealth.io")
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
OURS = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


def mixed_fleet() -> tuple[Fleet, FakeNodeCache, FakeClock]:
    """gpu-node-2 unhealthy and tainted, gpu-node-10 degraded, gpu-node-9's agent silent,
    gpu-node-1 without an agent."""
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=10), clock)
    nodes = FakeNodeCache()
    connect(fleet, "gpu-node-9", 2)
    clock.advance(6)
    connect(fleet, "gpu-node-10", 2)
    connect(fleet, "gpu-node-2", 2)
    send_transition(fleet, "gpu-node-2", 1, "unhealthy", XID79)
    send_transition(fleet, "gpu-node-10", 0, "degraded", HOT)
    for name in ("gpu-node-10", "gpu-node-9", "gpu-node-1"):
        nodes.set(name)
    nodes.set("gpu-node-2", OURS)
    clock.advance(6)
    assert fleet.check_silent() == ["gpu-node-9"]
    return fleet, nodes, clock


def test_fleet_and_overview_list_the_same_nodes_states_and_counts() -> None:
    fleet, nodes, clock = mixed_fleet()
    view = build_fleet_view(fleet, nodes.views(), K)
    breaker = CircuitBreaker(BreakerSettings(), clock)
    doc = fleet_json(
        view,
        breaker_json(breaker.status()),
        now=NOW,
        now_mono=clock.monotonic(),
        leader=True,
        dry_run=False,
    )
    page = StatusPage(fleet=fleet, keys=K, nodes=nodes, clock=clock).overview()
    api = ApiV1(
        cache=FleetCache(fleet, nodes, K, node_fragment),
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
    )
    cached = api.fleet_document()
    assert cached["nodes"] == doc["nodes"]  # the cached answer is the reference document
    assert cached["summary"] == doc["summary"] and cached["continue"] is None

    order = ["gpu-node-1", "gpu-node-2", "gpu-node-9", "gpu-node-10"]
    assert [n["name"] for n in doc["nodes"]] == [n["name"] for n in page["nodes"]] == order
    states = {n["name"]: n["state"] for n in doc["nodes"]}
    assert states == {n["name"]: n["state"] for n in page["nodes"]}
    assert states == {
        "gpu-node-1": "unknown",
        "gpu-node-2": "unhealthy",
        "gpu-node-9": "unknown",
        "gpu-node-10": "degraded",
    }
    assert doc["summary"]["nodes"] == page["summary"]["nodes_by_state"]
    assert doc["summary"]["gpus"] == page["summary"]["gpus_by_state"]
    assert doc["summary"]["gpus"] == {"healthy": 2, "degraded": 1, "unknown": 2, "unhealthy": 1}
    assert page["summary"]["nodes"] == 4 and page["summary"]["gpus"] == 6
    n2 = next(n for n in doc["nodes"] if n["name"] == "gpu-node-2")
    assert n2["taints"] == [OURS] and n2["in_cluster"] and n2["agent"]
    assert n2["gpus"][1]["conditions"][0]["code"] == "xid-79"
    p2 = next(n for n in page["nodes"] if n["name"] == "gpu-node-2")
    assert p2["taints"] == ["gpuhealth.io/unhealthy=xid-79:NoSchedule"]
    assert n2["nics"] == [] and p2["rails"] == []


def test_fleet_and_overview_show_the_rails() -> None:
    """/api/v1/fleet carries every port as the agent sent it; the page only the ports that are
    not well, with the GPUs behind each by index."""
    clock = FakeClock()
    fleet = Fleet(FleetSettings(), clock)
    nodes = FakeNodeCache()
    connect(fleet, "gpu-node-7", 2)
    nodes.set("gpu-node-7")
    flapping = nic("gpu-node-7", [1], verdicts=["rail-flapping"], flaps=4, last_flap=NOW)
    well = nic("gpu-node-7", [0], device="mlx5_1")
    fleet.on_message("gpu-node-7", snapshot("gpu-node-7", 2, nics=[well, flapping]))
    view = build_fleet_view(fleet, nodes.views(), K)
    doc = fleet_json(view, {}, now=NOW, now_mono=0.0, leader=True, dry_run=False)
    [n] = doc["nodes"]
    assert [(p["device"], p["verdicts"], p["gpus"]) for p in n["nics"]] == [
        ("mlx5_1", [], [gpu_uuid(0, "gpu-node-7")]),
        ("mlx5_0", ["rail-flapping"], [gpu_uuid(1, "gpu-node-7")]),
    ]
    [p] = StatusPage(fleet=fleet, keys=K, nodes=nodes, clock=clock).overview()["nodes"]
    assert p["rails"] == [
        {
            "port": "mlx5_0/1",
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 400.0,
            "flaps": 4,
            "last_flap": NOW.isoformat(),
            "verdicts": ["rail-flapping"],
            "gpus": [1],
        }
    ]


def test_one_breaker_document() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=1), clock)
    breaker.request("a", 4)
    breaker.request("b", 4)  # over the limit of 1: trips
    doc = breaker_json(breaker.status())
    assert doc == {
        "enabled": True,
        "open": True,
        "trips": 1,
        "tripped_at": clock.now().isoformat(),
        "nodes_tainted_in_window": 1,
        "limit": 1,
        "max_fraction": 0.0,
        "window_s": breaker.settings.window_s,
        "blocked_nodes": ["b"],
        "pools": [],
    }
    breaker.reset()
    breaker.request("s1", 4, pool="small", pool_nodes=2)
    breaker.request("s2", 4, pool="small", pool_nodes=2)  # the pool's budget of 1: trips it
    assert breaker_json(breaker.status())["pools"] == [
        {
            "pool": "small",
            "open": True,
            "nodes_tainted_in_window": 1,
            "limit": 1,
            "tripped_at": clock.now().isoformat(),
        }
    ]
    cache = FleetCache(Fleet(clock=clock), FakeNodeCache(), K, node_fragment)
    assert (
        build_overview(cache, [], matched=0, prefix=K.prefix, now=NOW, breaker=doc)["breaker"]
        is doc
    )


def episode(node: str, phase: Phase, evicted: int = 0) -> Episode:
    fault = Fault(fingerprint="f" * 16, boot_id="b", detected_at=NOW, gpus=[])
    return Episode(
        name=f"{node}-ep",
        spec=Spec(node_name=node, action="reset-gpu", scope="gpu", fault=fault),
        status=Status(
            phase=phase,
            reason="Draining",
            times=PhaseTimes(detected=NOW, draining=NOW + timedelta(seconds=30)),
            evicted_count=evicted,
        ),
    )


def test_fleet_and_overview_carry_the_same_remediation_pipeline() -> None:
    fleet, nodes, clock = mixed_fleet()
    eps = [episode("gpu-node-2", Phase.DRAINING, evicted=2)]
    breaker = CircuitBreaker(BreakerSettings(), clock)
    api = ApiV1(
        cache=FleetCache(fleet, nodes, K, node_fragment),
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
        episodes=lambda: eps,
    )
    page = StatusPage(fleet=fleet, nodes=nodes, clock=clock, episodes=lambda: eps)
    doc, overview = api.fleet_document(), page.overview()
    assert doc["remediation"] == overview["remediation"]
    rem = doc["remediation"]
    assert rem["total"] == 1 and rem["pipeline"]["Draining"] == 1
    assert sum(rem["pipeline"].values()) == 1
    (row,) = rem["episodes"]
    assert (row["node"], row["phase"], row["action"], row["evicted"]) == (
        "gpu-node-2", "Draining", "reset-gpu", 2,
    )  # fmt: skip
    off = ApiV1(
        cache=api.cache,
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
    )
    assert off.fleet_document()["remediation"] is None
    assert StatusPage(fleet=fleet, clock=clock).overview()["remediation"] is None


def test_the_fleet_and_the_status_page_say_why_a_nodes_allocations_are_unknown() -> None:
    import msgspec

    from tests.support.protocol import hello, snapshot

    clock = FakeClock()
    fleet = Fleet(FleetSettings(), clock)
    nodes = FakeNodeCache()
    why = "PodResources: PodResources socket /var/lib/kubelet/pod-resources/kubelet.sock missing"
    for name in ("blind", "seeing"):
        nodes.set(name)
        fleet.on_connect(name, hello(name, 2))
    fleet.on_message(
        "blind", msgspec.structs.replace(snapshot("blind", 2), allocations_unknown=why)
    )
    fleet.on_message("seeing", snapshot("seeing", 2))  # known: no pods
    doc = fleet_json(
        build_fleet_view(fleet, nodes.views(), K),
        breaker_json(CircuitBreaker(BreakerSettings(), clock).status()),
        now=NOW,
        now_mono=clock.monotonic(),
        leader=True,
        dry_run=False,
    )
    page = StatusPage(fleet=fleet, keys=K, nodes=nodes, clock=clock).overview()
    for listing in (doc["nodes"], page["nodes"]):
        got = {n["name"]: n["allocations_unknown"] for n in listing}
        assert got == {"blind": why, "seeing": None}
