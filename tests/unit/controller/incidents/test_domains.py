"""The NVLink domain judge (pure), table-tested with storm shapes, and the breaker's
all-or-nothing group admission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateVerdict, HardWrite, WriteGate
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.incidents.domains import (
    NodeFabric,
    fabric_fault,
    is_fabric_fault,
    judge_domains,
    node_domain,
    valid_domain,
)
from gpuhealth.protocol import Condition, HealthState
from tests.support.clock import FakeClock

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
D = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
S = DomainSettings(min_nodes=2, window_s=300.0)


def rack(n: int, faulty: dict[int, float], domain: str = D) -> list[NodeFabric]:
    """``n`` trays of ``domain``; ``faulty``: tray -> seconds after T0 its fault appeared."""
    return [
        NodeFabric(
            f"tray{i:02d}",
            domain,
            T0 + timedelta(seconds=faulty[i]) if i in faulty else None,
            "fabric-degraded" if i in faulty else "",
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("name", "nodes", "open_", "incident", "faulty"),
    [
        ("healthy rack", rack(18, {}), {}, False, 0),
        ("one tray's own fault stays the tray's", rack(18, {3: 0}), {}, False, 1),
        ("4 of 18 at once: the fabric", rack(18, {3: 0, 4: 1, 5: 2, 6: 3}), {}, True, 4),
        ("2 faults far apart: two trays' own", rack(18, {1: 0, 9: 3600}), {}, False, 2),
        ("2 far apart, then 2 together", rack(18, {1: 0, 9: 3600, 10: 3650}), {}, True, 3),
        ("open stays open while one tray is faulty", rack(18, {5: 0}), {D: ()}, True, 1),
        ("open closes when every tray is clean", rack(18, {}), {D: ()}, False, 0),
        ("a whole rack down", rack(18, dict.fromkeys(range(18), 5.0)), {}, True, 18),
    ],
)
def test_the_judge(
    name: str,
    nodes: list[NodeFabric],
    open_: dict[str, tuple[str, ...]],
    incident: bool,
    faulty: int,
) -> None:
    (v,) = judge_domains(nodes, open_, S)
    assert (v.incident, len(v.faulty), len(v.nodes)) == (incident, faulty, 18), name
    if incident:
        assert D in v.reason and f"{faulty} of 18" in v.reason


def test_two_racks_are_judged_apart_and_nodes_without_a_domain_are_ignored() -> None:
    other = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.8"
    nodes = [
        *rack(18, {0: 0}),
        *[NodeFabric(f"b{i}", other, T0 if i == 0 else None, "xid-149") for i in range(18)],
        NodeFabric("hgx", None, T0, "nvswitch-fatal"),
    ]
    verdicts = {v.domain: v for v in judge_domains(nodes, {}, S)}
    assert set(verdicts) == {D, other}
    assert not verdicts[D].incident and not verdicts[other].incident


def test_disabled_opens_nothing() -> None:
    (v,) = judge_domains(rack(18, {1: 0, 2: 0}), {}, DomainSettings(enabled=False))
    assert not v.incident


def cond(code: str, since: datetime | None, xid: int | None = None) -> Condition:
    return Condition(reason="R", code=code, severity="degraded", xid=xid, since=since)


@pytest.mark.parametrize(
    ("gpu", "node", "want"),
    [
        ([], [], (None, "")),
        ([cond("thermal", T0)], [], (None, "")),
        ([cond("xid-79", T0, 79)], [], (None, "")),
        ([cond("xid-149", T0, 149)], [], (T0, "xid-149")),
        (
            [cond("xid-74", T0 + timedelta(1), 74), cond("fabric-degraded", T0)],
            [],
            (T0, "fabric-degraded"),
        ),
        ([], [cond("nvswitch-fatal", T0)], (T0, "nvswitch-fatal")),
        ([cond("fabric-not-ready", None)], [], (T0 + timedelta(hours=1), "fabric-not-ready")),
    ],
)  # fmt: skip
def test_a_nodes_fabric_fault(
    gpu: list[Condition], node: list[Condition], want: tuple[datetime | None, str]
) -> None:
    assert fabric_fault(gpu, node, S, T0 + timedelta(hours=1)) == want


def scoped(
    code: str, scope: str | None, since: datetime = T0, severity: HealthState = "unhealthy"
) -> Condition:
    """An operational event's condition with the driver's impact scope."""
    return Condition(
        reason="OperationalEvent", code=code, severity=severity, since=since, scope=scope
    )


@pytest.mark.parametrize(
    ("c", "want"),
    [
        (scoped("op-nvlink-1", "nvlink-domain"), True),
        # preview-only (an operational event without a legacy Xid: never above degraded)
        (scoped("goe-gpu-nvlink-0x0002", "nvlink-domain", severity="degraded"), False),
        (scoped("goe-gpu-nvlink-0x0002", "nvlink-domain", severity="healthy"), False),
        (scoped("fabric-degraded", "nvlink-domain", severity="degraded"), True),  # by its code
        (scoped("op-nvlink-1", "gpu"), False),
        (scoped("op-ras-1", "gpu-instance"), False),
        (scoped("op-bus-1", None), False),
        (scoped("fabric-degraded", "gpu"), True),  # the code counts whatever the scope
        (cond("xid-149", T0, 149), True),
        (cond("xid-79", T0, 79), False),
    ],
)  # fmt: skip
def test_a_condition_scoped_to_the_nvlink_domain_is_a_fabric_fault(
    c: Condition, want: bool
) -> None:
    assert is_fabric_fault(c, S) is want


def test_scoped_faults_on_trays_open_a_domain_incident() -> None:
    """Operational events scoped ``nvlink-domain`` on two trays at once: the fabric's fault."""
    faults = {
        0: fabric_fault([scoped("op-nvlink-1", "nvlink-domain")], [], S, T0),
        1: fabric_fault(
            [scoped("op-nvlink-1", "nvlink-domain", T0 + timedelta(seconds=30))], [], S, T0
        ),
        2: fabric_fault([scoped("op-nvlink-1", "gpu")], [], S, T0),
    }
    nodes = [NodeFabric(f"tray{i}", D, since, code) for i, (since, code) in faults.items()]
    (v,) = judge_domains(nodes, {}, S)
    assert v.incident and v.faulty == ("tray0", "tray1") and v.faults == ("op-nvlink-1",)


def test_a_nodes_domain_agent_first_then_label() -> None:
    assert node_domain([D, D, None, "x.1"], "label.1") == D
    assert node_domain([None, None], D) == D
    assert node_domain([], None) is None
    assert node_domain([], "not a label value!") is None
    assert valid_domain("a" * 64) is None


def test_the_breaker_admits_a_group_whole_or_holds_it_whole() -> None:
    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1, min_nodes=1), clock)
    group = [f"tray{i}" for i in range(18)]
    assert b.request_group(group, 180) is GateVerdict.ALLOW  # limit 18: fits exactly
    assert all(b.request(n, 180) is GateVerdict.ALLOW for n in group)  # admitted, counted once
    assert b.status().recent_nodes == 18
    assert b.request_group(["x", "y"], 180) is GateVerdict.TRIP
    assert b.status().blocked_nodes == ("x", "y")
    assert b.request_group(group, 180) is GateVerdict.ALLOW  # already admitted: still whole

    small = CircuitBreaker(BreakerSettings(max_fraction=0.1, min_nodes=1), clock)
    assert small.request_group(group, 50) is GateVerdict.TRIP  # 18 > 5: none admitted
    assert small.status().recent_nodes == 0 and len(small.status().blocked_nodes) == 18


def test_the_gate_refuses_resets_of_a_held_node_and_group_asks_only_on_the_leader() -> None:
    clock = FakeClock()
    leading = [True]
    gate = WriteGate(
        CircuitBreaker(BreakerSettings(max_fraction=1.0, min_nodes=100), clock),
        gpu_nodes=lambda: 18,
        leading=lambda: leading[0],
    )
    gate.held = lambda node: "NVLink domain d" if node == "tray1" else None
    refused = gate.request(HardWrite("tray1", "reset-gpu"))
    assert (refused.allowed, refused.reason) == (False, "DomainIncident")
    assert not gate.request(HardWrite("tray1", "reboot")).allowed
    assert gate.request(HardWrite("tray1", "node-taint")).allowed
    assert gate.request(HardWrite("tray2", "reset-gpu")).allowed
    leading[0] = False
    assert gate.request_group(["a", "b"], "node-taint").reason == "NotLeader"


FAULTED = ("tray01", "tray02")


def silent(nodes: list[NodeFabric], *names: str) -> list[NodeFabric]:
    """``nodes`` with those named not reporting (disconnected, silent, not back yet)."""
    return [
        NodeFabric(n.name, n.domain, None, "", reporting=False) if n.name in names else n
        for n in nodes
    ]


@pytest.mark.parametrize(
    ("name", "nodes", "faulted", "incident", "waiting"),
    [
        ("every member that faulted reports healthy", rack(6, {}), ("tray01", "tray02"), False, 0),
        ("one that faulted is silent", silent(rack(6, {}), "tray02"), FAULTED, True, 1),
        ("none reports (a new leader)", silent(rack(6, {}), *[f"tray0{i}" for i in range(6)]),
         FAULTED, True, 2),
        ("a silent one that never faulted", silent(rack(6, {}), "tray05"), ("tray01",), False, 0),
        ("one still faulty", rack(6, {1: 0}), ("tray01", "tray02"), True, 0),
        ("a new fault joins the faulted", rack(6, {4: 0}), ("tray01",), True, 0),
    ],
)  # fmt: skip
def test_an_open_domain_closes_on_positive_evidence_only(
    name: str, nodes: list[NodeFabric], faulted: tuple[str, ...], incident: bool, waiting: int
) -> None:
    (v,) = judge_domains(nodes, {D: faulted}, S)
    assert (v.incident, len(v.waiting)) == (incident, waiting), name
    if incident and not v.faulty:
        assert "have not reported a healthy fabric since" in v.reason


def test_the_faulted_grow_with_each_new_fault() -> None:
    (v,) = judge_domains(rack(6, {4: 0}), {D: ("tray01",)}, S)
    assert v.faulted == ("tray01", "tray04")
    (new,) = judge_domains(rack(6, {1: 0, 2: 1}), {}, S)
    assert new.faulted == ("tray01", "tray02") and new.waiting == ()


def test_a_fault_first_seen_before_a_resolution_does_not_count() -> None:
    c = Condition(reason="R", code="fabric-degraded", severity="degraded", since=T0)
    assert fabric_fault([c], [], S, T0) == (T0, "fabric-degraded")
    assert fabric_fault([c], [], S, T0, after=T0) == (None, "")
    later = Condition(reason="R", code="xid-149", severity="unhealthy", xid=149, since=T0)
    after = T0 - timedelta(seconds=1)
    assert fabric_fault([c, later], [], S, T0, after=after)[0] == T0
