"""DomainMonitor over a real Fleet, breaker and gate (the node cache stubbed): one incident,
the domain taint for every node or none, resets refused, the taint governed when it closes;
after the first evaluation only changed nodes are read again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.controller.breaker.gate import CircuitBreaker, HardWrite, WriteGate
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents import IncidentBook
from gpuhealth.controller.incidents.domain_monitor import HELD, NOT_LEADING, TAINTED, DomainMonitor
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.plan import plan_node
from gpuhealth.controller.taints.policy import DesiredNode, Taint
from gpuhealth.protocol import Condition
from tests.support.clock import FakeClock
from tests.support.fleet import connect
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import snapshot

D = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
KEYS = Keys()
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def fault() -> Condition:
    return Condition(reason="R", code="fabric-degraded", severity="degraded", since=NOW)


def monitor(
    n: int = 6, *, fraction: float = 1.0, leading: bool = True
) -> tuple[DomainMonitor, Fleet, WriteGate, list[tuple[str, KubeEvent]], list[str]]:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    cache = FakeNodeCache()
    for i in range(n):
        cache.set(f"t{i}", labels={"nvidia.com/gpu.clique": D})
    cache.set("hgx")
    for v in cache.views():
        connect(fleet, v.name)
    breaker = CircuitBreaker(BreakerSettings(max_fraction=fraction, min_nodes=1), clock)
    gate = WriteGate(breaker, gpu_nodes=lambda: 20)
    events: list[tuple[str, KubeEvent]] = []
    queued: list[str] = []
    m = DomainMonitor(
        DomainSettings(),
        KEYS,
        fleet=fleet,
        cache=cache,  # type: ignore[arg-type]
        book=IncidentBook(),
        gate=gate,
        clock=clock,
        leading=lambda: leading,
        enqueue=queued.append,
        event=lambda node, ev: events.append((node, ev)),
    )
    gate.held = m.holding
    return m, fleet, gate, events, queued


def faulty(fleet: Fleet, *nodes: str) -> None:
    for n in nodes:
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))


def test_one_faulty_tray_is_no_incident() -> None:
    m, fleet, _, events, _ = monitor()
    faulty(fleet, "t1")
    m.evaluate()
    assert m.book.list(kind="domain") == [] and events == []
    assert m.taint_for("t0") is None


def test_two_faulty_trays_taint_the_whole_domain_and_hold_its_resets() -> None:
    m, fleet, gate, events, queued = monitor()
    faulty(fleet, "t1", "t4")
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert (incident.key, incident.decision) == (D, TAINTED)
    want = Taint(KEYS.domain_taint, D, "NoSchedule")
    assert [m.taint_for(f"t{i}") for i in range(6)] == [want] * 6
    assert m.taint_for("hgx") is None
    assert sorted(set(queued)) == [f"t{i}" for i in range(6)]
    assert {n for n, ev in events if ev.reason == "NvlinkDomainIncident"} == set(queued)
    refused = gate.request(HardWrite("t0", "reset-gpu"))
    assert (refused.allowed, refused.reason) == (False, "DomainIncident")
    assert gate.request(HardWrite("hgx", "reset-gpu")).allowed
    m.evaluate()  # steady: no new Events, same incident
    assert len(events) == 6 and len(m.book.list(kind="domain")) == 1

    for n in ("t1", "t4"):
        fleet.on_message(n, snapshot(n, 2))
    m.evaluate()
    assert m.book.list(kind="domain") == []
    assert all(m.taint_for(f"t{i}") is None for i in range(6))
    assert gate.request(HardWrite("t0", "reset-gpu")).allowed
    assert {n for n, ev in events if ev.reason == "NvlinkDomainRecovered"} == set(queued)


def test_the_breaker_holds_the_domain_whole_until_reset() -> None:
    m, fleet, gate, _, _ = monitor(fraction=0.1)  # limit 2 of 20: a 6-node domain does not fit
    faulty(fleet, "t1", "t2")
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert incident.decision == HELD
    assert all(m.taint_for(f"t{i}") is None for i in range(6))
    gate.reset(by="test")
    gate.breaker.settings = BreakerSettings(max_fraction=1.0, min_nodes=1)
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert incident.decision == TAINTED
    assert all(m.taint_for(f"t{i}") is not None for i in range(6))


def test_a_replica_that_does_not_lead_records_and_writes_nothing() -> None:
    m, fleet, gate, _, _ = monitor(leading=False)
    faulty(fleet, "t0", "t5")
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert incident.decision == NOT_LEADING
    assert m.taint_for("t0") is None
    assert gate.breaker.status().recent_nodes == 0


def test_the_domain_taint_goes_from_a_node_without_a_report() -> None:
    """Not authoritative (no agent data) keeps our taints, except the governed domain key."""
    taint = {"key": KEYS.domain_taint, "value": D, "effect": "NoSchedule"}
    view = NodeView("t0", "1", taints=(taint,))
    desired = DesiredNode(
        taints=frozenset(), authoritative=False, manage_meta=False,
        governed=frozenset({KEYS.domain_taint}),
    )  # fmt: skip
    plan = plan_node(view, desired, KEYS)
    assert [t.key for t in plan.removed] == [KEYS.domain_taint]
    kept = plan_node(view, DesiredNode(frozenset(), False, False), KEYS)
    assert kept.removed == ()


def test_after_the_first_evaluation_only_changed_nodes_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, fleet, _, _, _ = monitor(n=200)
    m.evaluate()
    read: list[str] = []
    real = m._fact
    monkeypatch.setattr(m, "_fact", lambda name, now: read.append(name) or real(name, now))
    for _ in range(50):
        fleet.on_message("t7", snapshot("t7", 2))  # heartbeats and reports: no change
    m.evaluate()
    assert read == []  # a quiet fleet reads no node
    faulty(fleet, "t3", "t9")
    verdicts = m.evaluate()
    assert sorted(read) == ["t3", "t9"]
    assert [(v.domain, v.incident, len(v.nodes)) for v in verdicts] == [(D, True, 200)]
    assert len(m.book.list(kind="domain")) == 1


def test_a_node_that_leaves_the_domain_by_its_label_or_by_deletion_is_judged_again() -> None:
    m, fleet, _, _, queued = monitor(n=3)
    cache: FakeNodeCache = m.cache  # type: ignore[assignment]
    faulty(fleet, "t0", "t1")
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert set(incident.subjects.nodes) == {"t0", "t1", "t2"}
    cache.set("t2", labels={"nvidia.com/gpu.clique": "other.1"})  # relabelled
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    assert set(incident.subjects.nodes) == {"t0", "t1"}
    assert m.taint_for("t2") is None and "t2" in queued
    fleet.on_message("t1", snapshot("t1", 2))  # t1 recovered; t0 still faulty: stays open
    m.evaluate()
    assert len(m.book.list(kind="domain")) == 1
    fleet.on_message("t0", snapshot("t0", 2))
    m.evaluate()
    assert m.book.list(kind="domain") == []


def test_an_operators_resolve_lifts_the_taint_and_old_faults_do_not_reopen_it() -> None:
    from gpuhealth.controller.incidents.lifecycle import OnCallAction

    m, fleet, _, events, queued = monitor()
    clock: FakeClock = m.clock  # type: ignore[assignment]

    def fault_now(*nodes: str) -> None:
        c = Condition(reason="R", code="fabric-degraded", severity="degraded", since=clock.now())
        for n in nodes:
            fleet.on_message(n, snapshot(n, 2, faults={0: c}))

    fault_now("t1", "t4")
    m.evaluate()
    (incident,) = m.book.list(kind="domain")
    clock.advance(60)
    m.resolve(incident, OnCallAction("alice", clock.now(), "fabric manager restarted"))
    assert m.book.list(kind="domain") == [] and m.taint_for("t0") is None
    closed = m.book.get(incident.id)
    assert closed is not None and closed.close_reason.startswith("resolved by alice")
    assert {n for n, ev in events if ev.reason == "NvlinkDomainRecovered"} == {
        f"t{i}" for i in range(6)
    }
    # the agents still report the faults, first seen before the resolution: no new incident
    fleet.on_message("t1", snapshot("t1", 2, faults={0: closed_fault(clock)}))
    m.evaluate()
    assert m.book.list(kind="domain") == []
    # a fault first seen after it opens it again
    clock.advance(1)
    fault_now("t2", "t3")
    m.evaluate()
    (again,) = m.book.list(kind="domain")
    assert again.id == incident.id and m.taint_for("t0") is not None
    assert "t0" in queued


def closed_fault(clock: FakeClock) -> Condition:
    """A fabric fault first seen a minute before now (before the resolution)."""
    return Condition(
        reason="R",
        code="fabric-degraded",
        severity="degraded",
        since=clock.now() - timedelta(seconds=61),
    )


def test_the_monitor_knows_the_domains_it_opened_closed_or_adopted() -> None:
    m, fleet, _, _, _ = monitor()
    assert not m.knows(D)
    faulty(fleet, "t1", "t4")
    m.evaluate()
    assert m.knows(D)
    for n in ("t1", "t4"):
        fleet.on_message(n, snapshot(n, 2))
    m.evaluate()
    assert m.book.list(kind="domain") == [] and m.knows(D)  # closed here: known
    (closed,) = m.book.list(kind="domain", include_closed=True)
    other, _, _, _, _ = monitor()
    other.adopt([closed])
    assert other.knows(D) and not other.knows("another-domain")
