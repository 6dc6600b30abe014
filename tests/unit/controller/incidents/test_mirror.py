"""The book and the GPUIncident objects kept in step (the objects in memory,
tests/support/incidents.py; the real API server in tests/integration/test_incident_*.py):
what is written at once and what waits for the persist interval, nothing written unless the
write gate says so, conflicts re-read, failures retried with backoff and counted, the
retention; on-call's edits back into the book; what each replica shows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.incidents.lifecycle import OnCallAction
from gpuhealth.controller.incidents.mirror import IncidentMirror, IncidentsShown, MirrorMetrics
from gpuhealth.controller.incidents.model import Incident, IncidentBook, Subjects
from gpuhealth.controller.incidents.resource import lifecycle_wire
from gpuhealth.controller.incidents.settings import IncidentSettings
from gpuhealth.controller.kube.rest import TransientKubeError
from gpuhealth.controller.names import Keys
from tests.support.clock import FakeClock
from tests.support.incidents import MemoryIncidents

K = Keys()


class World:
    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.book = IncidentBook(closed_keep=settings.pop("closed_keep", 200))
        self.objects = MemoryIncidents()
        self.registry = CollectorRegistry()
        self.writing = True
        self.mirror = IncidentMirror(
            IncidentSettings(closed_keep=self.book._closed_keep, **settings),
            self.book,
            self.objects,
            K,
            clock=self.clock,
            may_write=lambda: self.writing,
            metrics=MirrorMetrics(self.registry),
            rand=lambda: 0.5,
        )
        self.shown = IncidentsShown(self.book, self.objects, self.mirror)
        self.resolved: list[tuple[str, str]] = []

    def open(self, key: str = "n1", **kw: Any) -> Incident:
        return self.book.open(
            "unwatched",
            key,
            subjects=Subjects(nodes=(key,)),
            decision=kw.pop("decision", "condition AgentMissing"),
            reason="GPU node with no gpuhealth agent",
            now=self.clock.now(),
            evidence={"gpus": 8},
        )

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def stored(self, iid: str) -> dict[str, Any]:
        return self.objects.objects[iid]


async def test_an_incident_is_written_at_once_and_its_last_seen_at_the_interval() -> None:
    w = World(persist_interval_s=300.0)
    w.mirror.activate()
    inc = w.open()
    assert await w.mirror.flush() == 0.0
    assert w.objects.writes == [("create", inc.id), ("status", inc.id)]
    obj = w.stored(inc.id)
    assert obj["spec"] == {} and obj["status"]["state"] == "open"
    assert obj["metadata"]["labels"] == {
        K.incident_kind_label: "unwatched",
        K.incident_state_label: "open",
    }
    # every report moves lastSeen: not a write of its own...
    w.clock.advance(30)
    seen_at = msgspec.to_builtins(w.clock.now())
    w.open()
    await w.mirror.flush()
    assert len(w.objects.writes) == 2
    assert w.sample("gpuhealth_incident_writes_pending") == 0
    # ... until the interval's full pass
    await w.mirror.flush(full=True)
    assert w.objects.writes[-1] == ("status", inc.id)
    assert w.stored(inc.id)["status"]["lastSeen"] == seen_at
    # a decision change is at once
    w.open(decision="condition AgentMissing + taint")
    await w.mirror.flush()
    assert w.stored(inc.id)["status"]["decision"] == "condition AgentMissing + taint"
    # closing: the state label and the status
    w.book.close(inc.id, w.clock.now(), reason="its agent reports again")
    await w.mirror.flush()
    assert w.objects.writes[-2:] == [("labels", inc.id), ("status", inc.id)]
    assert w.stored(inc.id)["metadata"]["labels"][K.incident_state_label] == "closed"
    assert w.stored(inc.id)["status"]["closeReason"] == "its agent reports again"
    assert w.sample("gpuhealth_incident_writes_total", op="status", result="ok") == 4


async def test_nothing_is_written_unless_the_gate_allows_it() -> None:
    w = World()
    w.mirror.activate()
    w.writing = False  # not leading, or dry run
    inc = w.open()
    assert await w.mirror.flush(full=True) == 0.0
    assert w.objects.writes == [] and w.sample("gpuhealth_incident_writes_pending") == 1
    w.writing = True
    await w.mirror.flush()
    assert [op for op, _ in w.objects.writes] == ["create", "status"]
    assert w.stored(inc.id)["status"]["kind"] == "unwatched"


async def test_a_failed_write_keeps_the_decision_backs_off_and_is_retried() -> None:
    w = World(retry_backoff_s=1.0, retry_backoff_max_s=4.0)
    w.mirror.activate()
    inc = w.open()
    w.objects.fail_next = [TransientKubeError("HTTP 503", 503), TransientKubeError("x", 0)]
    assert await w.mirror.flush() == 1.0
    assert await w.mirror.flush() == 2.0  # doubling
    assert w.sample("gpuhealth_incident_writes_total", op="create", result="error") == 2
    assert w.sample("gpuhealth_incident_writes_pending") == 1
    assert w.book.get(inc.id) == inc  # the decision stays
    assert await w.mirror.flush() == 0.0
    assert w.stored(inc.id)["status"]["state"] == "open"
    assert await w.mirror.flush() == 0.0 and w.mirror.backoff.attempt == 0


async def test_a_conflict_is_read_again_and_written_next() -> None:
    w = World()
    w.mirror.activate()
    inc = w.open()
    await w.mirror.flush()
    # on-call edits the object meanwhile: the watch has not brought it yet
    obj = w.stored(inc.id)
    obj["metadata"]["resourceVersion"] = "999"
    w.open(decision="changed")
    await w.mirror.flush()
    assert w.sample("gpuhealth_incident_writes_total", op="status", result="conflict") == 1
    await w.mirror.flush()
    assert w.stored(inc.id)["status"]["decision"] == "changed"


async def test_closed_objects_go_after_the_retention_or_beyond_the_keep() -> None:
    w = World(closed_retention_s=3600.0, closed_keep=2)
    w.mirror.activate()
    ids = []
    for n in range(4):
        ids.append(w.open(f"n{n}").id)
        w.clock.advance(1)
    await w.mirror.flush()
    for iid in ids[:3]:
        w.book.close(iid, w.clock.now())
        w.clock.advance(1)
    await w.mirror.flush(full=True)
    # three closed, two kept: the oldest goes
    assert ("delete", ids[0]) in w.objects.writes and ids[0] not in w.objects.objects
    assert set(w.objects.objects) == set(ids[1:])
    w.clock.advance(3600)
    await w.mirror.flush(full=True)
    assert set(w.objects.objects) == {ids[3]}  # the open one stays
    assert w.book.get(ids[1]) is None  # and the book forgets them: not written again
    await w.mirror.flush(full=True)
    assert set(w.objects.objects) == {ids[3]}


def lifecycle(**actions: OnCallAction) -> dict[str, Any]:
    from gpuhealth.controller.incidents.lifecycle import Lifecycle

    return msgspec.to_builtins(lifecycle_wire(Lifecycle(**actions)))  # type: ignore[no-any-return]


async def test_on_calls_edits_come_back_and_take_effect() -> None:
    w = World()
    w.mirror.resolvers["unwatched"] = lambda i, a: w.resolved.append((i.id, a.by))
    w.mirror.activate()
    inc = w.open()
    await w.mirror.flush()
    at = w.clock.now() + timedelta(seconds=5)
    ack = OnCallAction("alice", at, "on it")
    w.objects.edit_spec(inc.id, lifecycle(acknowledged=ack))
    now = w.clock.now()
    got = w.book.get(inc.id)
    assert got is not None and got.lifecycle.acknowledged == ack
    assert got.paging(now) == "acknowledged"
    await w.mirror.flush()
    seen = w.stored(inc.id)["status"]["observedLifecycle"]["acknowledged"]
    assert seen["applied"] is True
    silence = OnCallAction("bob", at, "swap", until=now + timedelta(hours=1))
    w.objects.edit_spec(inc.id, lifecycle(acknowledged=ack, silenced=silence))
    assert w.book.get(inc.id).paging(now) == "silenced"  # type: ignore[union-attr]
    assert w.book.get(inc.id).paging(now + timedelta(hours=2)) == "acknowledged"  # type: ignore[union-attr]
    resolve = OnCallAction("carol", at, "fixed")
    w.objects.edit_spec(inc.id, lifecycle(acknowledged=ack, resolved=resolve))
    assert w.resolved == [(inc.id, "carol")]
    closed = w.book.get(inc.id)
    assert closed is not None and not closed.open
    assert closed.close_reason == "resolved by carol: fixed"
    # seen once: the watch bringing the same object again does nothing
    w.objects.edit_spec(inc.id, lifecycle(acknowledged=ack, resolved=resolve))
    assert w.resolved == [(inc.id, "carol")]


async def test_a_replica_that_does_not_lead_shows_the_objects() -> None:
    w = World()
    w.mirror.activate()
    inc = w.open()
    await w.mirror.flush()
    w.mirror.deactivate()
    follower_book_is_empty = IncidentBook()
    shown = IncidentsShown(follower_book_is_empty, w.objects, w.mirror)
    assert [i.id for i in shown.list()] == [inc.id] and shown.counts()["unwatched"] == 1
    assert shown.get(inc.id) == w.book.get(inc.id)
    w.mirror.activate()
    assert shown.list() == []  # the leader shows its book


@pytest.mark.parametrize("active", [True, False])
async def test_an_edit_is_applied_only_by_an_active_mirror(active: bool) -> None:
    w = World()
    w.mirror.activate()
    inc = w.open()
    await w.mirror.flush()
    if not active:
        w.mirror.deactivate()
    w.objects.edit_spec(inc.id, lifecycle(resolved=OnCallAction("c", datetime.now(), "x")))
    got = w.book.get(inc.id)
    assert got is not None and got.open is not active


async def test_the_write_loop_waits_when_it_may_not_write_and_writes_when_woken() -> None:
    import asyncio

    w = World(persist_interval_s=300.0)
    w.writing = False  # dry run: decided, logged, never written
    w.mirror.activate()
    w.open()
    task = asyncio.create_task(w.mirror.run())
    await w.clock.settle()  # a loop that spun would never let the event loop go quiet
    assert not task.done() and w.objects.writes == []
    w.writing = True
    w.clock.advance(300.0)  # the interval's full pass
    await w.clock.settle()
    assert [op for op, _ in w.objects.writes] == ["create", "status"]
    w.open("n2")  # a new incident wakes it at once
    await w.clock.settle()
    assert [op for op, _ in w.objects.writes][-2:] == ["create", "status"]
    assert len(w.objects.writes) == 4
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not w.mirror.active  # the term ended
