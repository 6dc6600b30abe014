"""Taints removed by hand as override incidents: recorded with who, told in an Event, ended
by a new verdict, a recovery or an operator's resolve (which puts the taint back)."""

from __future__ import annotations

from gpuhealth.controller.incidents.lifecycle import OnCallAction
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.overrides import TaintOverrides
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import Taint
from tests.support.clock import FakeClock

K = Keys()
BAD = Taint(K.unhealthy_taint, "xid-79", "NoSchedule")
EVICT = Taint(K.unhealthy_taint, "xid-79", "NoExecute")


def overrides() -> tuple[TaintOverrides, list[str], list[tuple[str, KubeEvent]]]:
    queued: list[str] = []
    events: list[tuple[str, KubeEvent]] = []
    o = TaintOverrides(
        IncidentBook(),
        clock=FakeClock(),
        enqueue=queued.append,
        event=lambda n, e: events.append((n, e)),
    )
    return o, queued, events


def test_a_hand_removal_is_one_incident_per_taint_with_who_did_it() -> None:
    o, _, events = overrides()
    o.removed_by_hand("n1", frozenset({BAD, EVICT}), "kubectl-taint")
    assert o.of("n1") == {BAD, EVICT} and o.of("n2") == frozenset()
    incidents = o.book.list(kind="override")
    assert len(incidents) == 2
    for i in incidents:
        assert i.subjects.nodes == ("n1",) and i.override is not None
        assert i.override.by == "kubectl-taint" and "(kubectl-taint)" in i.reason
    assert [e.reason for _, e in events] == ["TaintAcknowledged"] * 2
    assert all("GPUIncident override-" in e.message for _, e in events)


def test_it_ends_with_the_verdict_and_a_resolve_puts_the_taint_back() -> None:
    o, queued, _ = overrides()
    o.removed_by_hand("n1", frozenset({BAD, EVICT}), "")
    o.settled("n1", frozenset({EVICT}), "the verdict changed or the node recovered")
    assert o.of("n1") == {BAD}
    (left,) = o.book.list(kind="override")
    o.resolve(left, OnCallAction("alice", o.clock.now(), "put it back"))
    assert o.of("n1") == frozenset() and queued == ["n1"]
    closed = o.book.get(left.id)
    assert closed is not None and closed.close_reason == "resolved by alice: put it back"
