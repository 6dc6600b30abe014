"""A capability lost fleet-wide (every agent without a reboot executor): the escalations are
capped, none puts an RMA label, and the nodes are one ``capability`` incident."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from gpuhealth.controller.incidents.capabilities import KEY, CapabilityWatch, no_executor
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.settings import SafetySettings
from tests.fakes.remediation_world import KEYS, World, fault_condition, node_facts
from tests.support.remediation import drive, runner_for, settings

XID79 = fault_condition("xid-79", "RESTART_BM")
NODES = 10


def fleet_without_reboot_executors() -> World:
    w = World()
    for i in range(NODES):
        n = node_facts(name=f"gpu-{i}", unhealthy={1: XID79})
        w.nodes[n.name] = replace(n, capabilities=frozenset({"reset-gpu", "validate"}))
    return w


async def test_an_agent_wide_misconfiguration_is_one_incident_and_no_rma_label() -> None:
    w = fleet_without_reboot_executors()
    cfg = settings(
        safety=SafetySettings(max_concurrent=100, max_fraction=1.0, max_unresolved_escalations=3)
    )
    r = runner_for(w, cfg)

    def settled() -> bool:
        eps = w.store.episodes()
        return len(eps) == NODES and all(e.status.reason == "NoExecutor" for e in eps)

    await drive(w, r, settled)
    phases = sorted(e.phase.value for e in w.store.episodes())
    assert phases.count(Phase.ESCALATED.value) == 3  # the escalation limit holds
    assert phases.count(Phase.PENDING.value) == NODES - 3
    assert not [n for n, f in w.nodes.items() if KEYS.rma_label in f.labels]
    for _ in range(3):  # more passes: still capped, still no label
        await drive(w, r, lambda: True)
    assert sum(e.phase is Phase.ESCALATED for e in w.store.episodes()) == 3

    book = IncidentBook()
    watch = CapabilityWatch(book, w.store.episodes, clock=w.clock, interval_s=30)
    found = watch.check()
    assert found is not None and len(found.nodes) == NODES
    (incident,) = book.list()
    assert incident.kind == "capability" and incident.key == KEY
    assert len(incident.subjects.nodes) == NODES
    assert dict(incident.evidence) == {"nodes": NODES, "escalated": 3, "waiting": NODES - 3}
    assert "reboot" in incident.reason
    watch.check()  # the same facts: the same one incident
    assert len(book.list(include_closed=True)) == 1 and book.opened_total["capability"] == 1

    # the agents are fixed and the operator deletes the episodes: the incident closes
    for ep in w.store.episodes():
        await w.store.delete(ep.name)
    assert watch.check() is None
    assert book.list() == [] and book.list(include_closed=True)[0].state == "closed"


async def test_only_unresolved_no_executor_episodes_count() -> None:
    w = fleet_without_reboot_executors()
    assert no_executor([]) is None
    await runner_for(w, settings()).consider("gpu-0")
    (ep,) = w.store.episodes()
    assert no_executor([ep]) is None  # Pending, not yet judged
    waiting = msgspec.structs.replace(
        ep, status=msgspec.structs.replace(ep.status, reason="NoExecutor", message="m")
    )
    found = no_executor([waiting])
    assert found is not None and found.waiting == ("gpu-0",) and found.escalated == ()
    released = msgspec.structs.replace(
        waiting, status=msgspec.structs.replace(waiting.status, phase=Phase.VALIDATING)
    )
    assert no_executor([released]) is None  # released: re-validating, no longer waiting


async def test_a_resolution_stops_the_episodes_before_it_counting_and_a_successor_keeps_it() -> (
    None
):
    from datetime import timedelta

    from gpuhealth.controller.incidents.lifecycle import ObservedLifecycle, OnCallAction, Seen

    w = fleet_without_reboot_executors()
    r = runner_for(w, settings(safety=SafetySettings(max_concurrent=100, max_fraction=1.0)))
    await drive(w, r, lambda: all(e.status.reason == "NoExecutor" for e in w.store.episodes()))
    book = IncidentBook()
    watch = CapabilityWatch(book, w.store.episodes, clock=w.clock, interval_s=30)
    assert watch.check() is not None
    (incident,) = book.list()
    w.clock.advance(60)
    action = OnCallAction(by="alice", at=w.clock.now(), reason="executor configured")
    watch.resolve(incident, action)
    assert book.list() == []  # closed
    assert watch.check() is None  # the episodes from before the resolution no longer count
    assert book.list() == []

    # a new leader restores the time from the object's observed lifecycle
    resolved = replace(
        book.list(include_closed=True)[0],
        observed=ObservedLifecycle(resolved=Seen(at=action.at, applied=True, seen_at=action.at)),
    )
    successor_book = IncidentBook()
    successor = CapabilityWatch(successor_book, w.store.episodes, clock=w.clock, interval_s=30)
    successor.adopt([resolved])
    assert successor.check() is None and successor_book.list() == []
    # without the resolution the same episodes open it again
    fresh = CapabilityWatch(IncidentBook(), w.store.episodes, clock=w.clock, interval_s=30)
    assert fresh.check() is not None
    # a fault detected after the resolution counts
    ep = w.store.episodes()[0]
    later = msgspec.structs.replace(
        ep,
        spec=msgspec.structs.replace(
            ep.spec,
            fault=msgspec.structs.replace(
                ep.spec.fault, detected_at=action.at + timedelta(seconds=1)
            ),
        ),
    )
    assert no_executor([later], action.at) is not None
