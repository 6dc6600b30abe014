from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.settings import UnwatchedSettings
from gpuhealth.controller.incidents.unwatched import NodeFact, UnwatchedWatch, unwatched
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import desired_node
from gpuhealth.controller.taints.settings import PolicySettings
from tests.support.clock import FakeClock
from tests.support.fleet import connect

KEYS = Keys("gpuhealth.io")


def fact(name: str, **kw: object) -> NodeFact:
    base: dict[str, object] = {
        "gpu_node": True,
        "gpus": 8,
        "first_seen": 0.0,
        "reporting": False,
        "last_heard": None,
    }
    base.update(kw)
    return NodeFact(name=name, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("f", "now", "expected"),
    [
        (fact("a"), 599.0, []),
        (fact("a"), 600.0, ["never-reported"]),
        (fact("a", gpu_node=False), 9999.0, []),
        (fact("a", reporting=True, last_heard=1.0), 9999.0, []),
        (fact("a", excluded=True), 9999.0, []),
        (fact("a", last_heard=500.0), 1099.0, []),
        (fact("a", last_heard=500.0), 1100.0, ["stopped-reporting"]),
        (fact("a", first_seen=5000.0), 5500.0, []),
    ],
)
def test_unwatched_decision(f: NodeFact, now: float, expected: list[str]) -> None:
    assert [u.why for u in unwatched([f], now, 600.0)] == expected


@dataclass
class View:
    name: str
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)


class Views:
    def __init__(self, *views: View) -> None:
        self.list = list(views)

    def views(self) -> list[View]:
        return self.list


def test_watch_reports_once_and_clears_when_the_agent_comes() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(), clock)
    book = IncidentBook()
    enqueued: list[str] = []
    views = Views(
        View("gpu-a", gpus=8),
        View("gpu-b", labels={"nvidia.com/gpu.present": "true"}),
        View("cpu-c"),
        View("gpu-d", gpus=8),
    )
    watch = UnwatchedWatch(
        UnwatchedSettings(grace_s=600.0),
        book,
        fleet,
        views,
        clock=clock,
        exclude_label=KEYS.exclude_label,
        enqueue=enqueued.append,
    )
    connect(fleet, "gpu-d", 8)
    assert watch.check() == []
    clock.advance(600)
    connect(fleet, "gpu-d", 8)  # still reporting
    assert watch.check() == ["gpu-a", "gpu-b"]
    assert sorted(i.subjects.nodes[0] for i in book.list()) == ["gpu-a", "gpu-b"]
    assert fleet.node_health("gpu-a").reporting == "missing"
    desired = desired_node(fleet.node_health("gpu-a"), PolicySettings(), KEYS)
    assert desired.condition is not None and desired.condition.reason == "AgentMissing"
    assert desired.condition.status == "Unknown" and desired.taints == frozenset()
    tainted = desired_node(
        fleet.node_health("gpu-a"), PolicySettings(taint_on_agent_missing=True), KEYS
    )
    assert {t.value for t in tainted.taints} == {"agent-missing"}
    # A quiet fleet: the next passes change nothing and enqueue nothing.
    enqueued.clear()
    for _ in range(5):
        clock.advance(30)
        assert watch.check() == []
    assert enqueued == [] and watch.count() == 2
    # The agent on gpu-a comes.
    connect(fleet, "gpu-a", 8)
    assert watch.check() == ["gpu-a"]
    assert fleet.node_health("gpu-a").reporting == "ok"
    assert [i.subjects.nodes[0] for i in book.list()] == ["gpu-b"]


def watch_of(fleet: Fleet, views: Views, clock: FakeClock, **kw: Any) -> UnwatchedWatch:
    """A watch with a 600 s grace that enqueues nowhere."""
    return UnwatchedWatch(
        UnwatchedSettings(grace_s=600.0),
        IncidentBook(),
        fleet,
        views,
        clock=clock,
        exclude_label=KEYS.exclude_label,
        enqueue=lambda _: None,
        **kw,
    )


def test_facts_leave_out_the_nodes_whose_agent_reports() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=60.0), clock)
    views = Views(View("gpu-a", gpus=8), View("gpu-b", gpus=8), View("gpu-c", gpus=8))
    watch = watch_of(fleet, views, clock)
    connect(fleet, "gpu-a", 8)
    connect(fleet, "gpu-b", 8)
    assert [f.name for f in watch.facts()] == ["gpu-c"]  # never reported
    clock.advance(61)
    connect(fleet, "gpu-a", 8)
    fleet.check_silent()  # gpu-b's agent went silent: a candidate again
    assert [(f.name, f.reporting) for f in watch.facts()] == [("gpu-b", False), ("gpu-c", False)]
    clock.advance(600)
    connect(fleet, "gpu-a", 8)
    fleet.check_silent()
    assert watch.check() == ["gpu-b", "gpu-c"]


def test_hellos_without_a_snapshot_never_reset_the_grace() -> None:
    """An agent crash-looping before its first Snapshot (a Hello every 30 s for 20 minutes) is
    unwatched once the grace has passed since the controller first saw the node (its Hellos
    used to reset the grace). One that sent its Snapshot and then reconnects with Hellos only
    is unwatched once the grace has passed since its last report; a healthy agent (Heartbeats)
    stays watched."""
    from tests.support.protocol import heartbeat, hello

    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=60.0), clock)
    views = Views(View("looping", gpus=8), View("was-fine", gpus=8), View("fine", gpus=8))
    watch = watch_of(fleet, views, clock)
    connect(fleet, "fine", 8)
    connect(fleet, "was-fine", 8)
    assert watch.check() == []
    clock.advance(120)
    unwatched_at: dict[str, float] = {}
    for step in range(40):
        fleet.on_connect("looping", hello("looping", 8))
        fleet.on_connect("was-fine", hello("was-fine", 8))
        fleet.on_message("fine", heartbeat("fine"))
        fleet.check_silent()
        for name in watch.check():
            unwatched_at.setdefault(name, 120 + step * 30)
        clock.advance(30)
    assert unwatched_at == {"looping": 600, "was-fine": 600}
    assert watch.is_missing("was-fine")
    assert watch.is_missing("looping") and fleet.node_health("looping").reporting == "missing"
    assert not watch.is_missing("fine")
