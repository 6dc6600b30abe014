"""A new leader takes the incidents over exactly (issue 38, item 2): each decider restored
from the incidents a leader before it decided (their GPUIncidents, round-tripped through the
object), before any agent reconnected; and the adoption's LIST retried while the API server
refuses, the book restored, the mirror activated only then."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.breaker.gate import CircuitBreaker, WriteGate
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.adoption import Adoption, restored
from gpuhealth.controller.incidents.domain_monitor import HELD, TAINTED, DomainMonitor
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.mirror import IncidentMirror, MirrorMetrics
from gpuhealth.controller.incidents.model import Incident, IncidentBook, Subjects
from gpuhealth.controller.incidents.overrides import TaintOverrides
from gpuhealth.controller.incidents.resource import new_object, status_of, stored_incident
from gpuhealth.controller.incidents.settings import IncidentSettings, JudgeSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import Taint
from tests.support.clock import FakeClock
from tests.support.fleet import connect
from tests.support.incidents import MemoryIncidents, unreachable
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import allocation, gpu_uuid, hello, snapshot
from tests.unit.controller.incidents.test_domain_monitor import fault
from tests.unit.controller.incidents.test_judge import Jobs, xid

D = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
KEYS = Keys()
DOMAIN_TAINT = Taint(KEYS.domain_taint, D, "NoSchedule")


def through_the_object(incident: Incident) -> Incident:
    """What a successor reads back of an incident its predecessor wrote."""
    obj = new_object(incident, KEYS)
    obj["metadata"]["resourceVersion"] = "1"
    obj["status"] = msgspec.to_builtins(status_of(incident))
    adopted = stored_incident(obj).incident()
    assert adopted is not None
    return adopted


def domain_monitor(
    clock: FakeClock, *, trays: int = 6, fraction: float = 1.0, agents: bool = True
) -> tuple[DomainMonitor, Fleet, FakeNodeCache]:
    fleet = Fleet(clock=clock)
    cache = FakeNodeCache()
    for i in range(trays):
        cache.set(f"t{i}", labels={"nvidia.com/gpu.clique": D})
        if agents:
            connect(fleet, f"t{i}")
    breaker = CircuitBreaker(BreakerSettings(max_fraction=fraction, min_nodes=1), clock)
    gate = WriteGate(breaker, gpu_nodes=lambda: 20)
    m = DomainMonitor(
        DomainSettings(),
        KEYS,
        fleet=fleet,
        cache=cache,  # type: ignore[arg-type]
        book=IncidentBook(),
        gate=gate,
        clock=clock,
        leading=lambda: True,
    )
    return m, fleet, cache


def own_fields(i: Incident) -> dict[str, object]:
    return {f: getattr(i, f) for f in Incident.__dataclass_fields__}


def test_restored_is_the_stored_and_this_replicas_own() -> None:
    clock = FakeClock()
    first, fleet, _ = domain_monitor(clock)
    for n in ("t1", "t2"):
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))
    first.evaluate()
    (stored,) = first.book.list()
    objects = MemoryIncidents()
    obj = new_object(stored, KEYS)
    obj["metadata"]["resourceVersion"] = "1"
    obj["status"] = msgspec.to_builtins(status_of(stored))
    objects.objects[stored.id] = obj
    own = Incident(
        kind="job",
        key="ml/Job/x",
        subjects=Subjects(nodes=("a",)),
        decision="no taint",
        reason="r",
        opened_at=clock.now(),
        last_seen=clock.now(),
    )
    stale = Incident(**{**own.__getstate__(), "key": "ml/Job/y"}) if False else own
    items = [stored_incident(obj)]
    got = restored(items, [own, stored])
    assert {i.id for i in got} == {stored.id, own.id}
    assert next(i for i in got if i.id == stored.id) == stored  # the object wins
    assert stale is own


def test_a_successor_taints_every_member_of_an_adopted_domain_at_once() -> None:
    clock = FakeClock()
    first, fleet, _ = domain_monitor(clock)
    for n in ("t1", "t2", "t4"):
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))
    first.evaluate()
    (decided,) = first.book.list(kind="domain")
    assert decided.domain is not None and decided.domain.faulted == ("t1", "t2", "t4")

    # the successor: the same Nodes, no agent reconnected yet
    second, fleet2, _ = domain_monitor(clock, agents=False)
    second.adopt([through_the_object(decided)])
    assert [second.taint_for(f"t{i}") for i in range(6)] == [DOMAIN_TAINT] * 6
    assert second.holding("t0") == f"NVLink domain {D}"
    second.evaluate()  # nobody reports: it stays open, the members that faulted awaited
    (kept,) = second.book.list(kind="domain")
    assert kept.decision == TAINTED and kept.evidence["waiting_nodes"] == 3
    assert [second.taint_for(f"t{i}") for i in range(6)] == [DOMAIN_TAINT] * 6

    # agents reconnect: healthy trays first, then the faulted ones one by one
    for n in ("t0", "t3", "t5", "t1", "t2"):
        connect(fleet2, n)
        second.evaluate()
        assert second.taint_for("t0") == DOMAIN_TAINT, f"lifted before t4 reported ({n})"
    connect(fleet2, "t4", faults={0: fault()})  # back, and still faulty: open
    second.evaluate()
    assert second.taint_for("t0") == DOMAIN_TAINT
    fleet2.on_message("t4", snapshot("t4", 2))  # healthy now: positive evidence from every one
    second.evaluate()
    assert second.book.list(kind="domain") == []
    assert all(second.taint_for(f"t{i}") is None for i in range(6))


def test_a_held_domain_is_adopted_held_and_admitted_after_the_breakers_reset() -> None:
    clock = FakeClock()
    first, fleet, _ = domain_monitor(clock, fraction=0.1)
    for n in ("t1", "t2"):
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))
    first.evaluate()
    (held,) = first.book.list(kind="domain")
    assert held.decision == HELD
    second, _, _ = domain_monitor(clock, fraction=0.1, agents=False)
    second.adopt([through_the_object(held)])
    assert second.taint_for("t0") is None  # held stays held: never some nodes
    second.gate.reset(by="test")
    second.gate.breaker.settings = BreakerSettings(max_fraction=1.0, min_nodes=1)
    second.evaluate()
    assert [second.taint_for(f"t{i}") for i in range(6)] == [DOMAIN_TAINT] * 6


def test_a_member_whose_node_is_gone_leaves_the_adopted_domain() -> None:
    clock = FakeClock()
    first, fleet, _ = domain_monitor(clock)
    for n in ("t1", "t2"):
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))
    first.evaluate()
    (decided,) = first.book.list(kind="domain")
    second, _, cache2 = domain_monitor(clock, agents=False)
    second.adopt([through_the_object(decided)])
    cache2.delete("t5")
    second.evaluate()
    (kept,) = second.book.list(kind="domain")
    assert "t5" not in kept.subjects.nodes and second.taint_for("t5") is None


async def test_a_successor_blames_the_same_gpu_with_the_same_condition() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    first = IncidentJudge(
        JudgeSettings(blame_hold_s=7200.0), IncidentBook(), fleet, clock=clock, jobs=Jobs()
    )
    first.on_connect("bad", hello("bad", 2))
    for job in ("a", "b", "c"):
        allocs = [allocation(gpu_uuid(0, "bad"), f"{job}-0")]
        first.on_message("bad", snapshot("bad", 2, allocations=allocs))
        first.on_message("bad", xid(clock, "bad", code=31))
        await first.step()
        clock.advance(60)
    (blamed,) = first.book.list(kind="gpu")
    want = first.blamed()
    clock.advance(600)

    fleet2 = Fleet(clock=clock)
    second = IncidentJudge(
        JudgeSettings(blame_hold_s=7200.0), IncidentBook(), fleet2, clock=clock, jobs=Jobs()
    )
    second.adopt([through_the_object(blamed)])
    assert second.blamed() == want  # the very condition: since, message, XID
    # the agent reconnects and says the GPU is healthy: the fleet shows the blame
    second.on_connect("bad", hello("bad", 2))
    second.on_message("bad", snapshot("bad", 2))
    g = fleet2.node_health("bad").gpus[0]
    assert g.state == "unhealthy" and g.conditions[-1] == want[("bad", gpu_uuid(0, "bad"))]
    # the hold ends when it would have for the first: 7200 s after the last fault
    clock.advance(7200 - 600 - 60 - 1)
    await second.decide()
    assert second.blamed() == want
    clock.advance(2)
    await second.decide()
    assert second.blamed() == {} and fleet2.node_health("bad").gpus[0].state == "healthy"


def test_the_overrides_are_adopted() -> None:
    clock = FakeClock()
    first = TaintOverrides(IncidentBook(), clock=clock)
    bad = Taint(KEYS.unhealthy_taint, "xid-79", "NoSchedule")
    first.removed_by_hand("n1", frozenset({bad}), "kubectl-taint")
    second = TaintOverrides(IncidentBook(), clock=clock)
    second.adopt([through_the_object(i) for i in first.book.list()])
    assert second.of("n1") == frozenset({bad}) and second.of("n2") == frozenset()


async def test_the_adoption_lists_until_the_api_server_answers() -> None:
    clock = FakeClock()
    objects = MemoryIncidents()
    m, fleet, _ = domain_monitor(clock)
    for n in ("t1", "t2"):
        fleet.on_message(n, snapshot(n, 2, faults={0: fault()}))
    m.evaluate()
    (stored,) = m.book.list()
    obj = new_object(stored, KEYS)
    obj["metadata"]["resourceVersion"] = "1"
    obj["status"] = msgspec.to_builtins(status_of(stored))
    objects.objects[stored.id] = obj
    book = IncidentBook()
    registry = CollectorRegistry()
    mirror = IncidentMirror(
        IncidentSettings(retry_backoff_s=1.0, retry_backoff_max_s=4.0),
        book,
        objects,
        KEYS,
        clock=clock,
        may_write=lambda: True,
        metrics=MirrorMetrics(registry),
        rand=lambda: 0.5,
    )
    adopted: list[list[Incident]] = []
    adoption = Adoption(objects, book, mirror, clock=clock, adopters=[adopted.append])
    objects.fail_next = [unreachable(), unreachable()]
    import asyncio

    task = asyncio.create_task(adoption.run())
    await clock.settle()
    assert not task.done() and not mirror.active and adopted == []
    clock.advance(1.0)
    await clock.settle()
    clock.advance(2.0)
    await clock.settle()
    await asyncio.wait_for(task, 1)
    assert registry.get_sample_value("gpuhealth_incident_adoption_failures_total") == 2
    assert registry.get_sample_value("gpuhealth_incidents_adopted") == 1
    assert [i.id for i in book.list()] == [stored.id] and book.get(stored.id) == stored
    assert [[i.id for i in a] for a in adopted] == [[stored.id]]
    assert mirror.active


@pytest.mark.parametrize("seconds", [0.0, 3600.0])
def test_unwatched_nodes_are_adopted(seconds: float) -> None:
    from gpuhealth.controller.incidents.settings import UnwatchedSettings
    from gpuhealth.controller.incidents.unwatched import UnwatchedWatch
    from tests.unit.controller.incidents.test_unwatched import View, Views

    clock = FakeClock()
    fleet = Fleet(clock=clock)
    views = Views(View("lonely", gpus=8), View("other", gpus=8))
    first = UnwatchedWatch(
        UnwatchedSettings(grace_s=600.0), IncidentBook(), fleet, views, clock=clock,
        exclude_label="x", enqueue=lambda _n: None,
    )  # fmt: skip
    first.check()
    clock.advance(600)
    first.check()
    (lonely, other) = sorted(first.book.list(), key=lambda i: i.key)
    clock.advance(seconds)
    fleet2 = Fleet(clock=clock)
    second = UnwatchedWatch(
        UnwatchedSettings(grace_s=600.0), IncidentBook(), fleet2, views, clock=clock,
        exclude_label="x", enqueue=lambda _n: None,
    )  # fmt: skip
    second.adopt([through_the_object(lonely)])  # the takeover: "other" counts from now
    assert fleet2.missing("lonely") and not fleet2.missing("other")
    second.check()
    assert fleet2.missing("lonely") and not fleet2.missing("other")
    clock.advance(599)
    second.check()
    assert not fleet2.missing("other")
    clock.advance(1)
    second.check()
    assert fleet2.missing("other") and other.key == "other"
