"""The judge between the stream and the fleet: charging XIDs to jobs, incidents, blame, the
overlay the policy sees (real Fleet, real policy, a fake pod lookup)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec
import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.jobs import JobRef
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.overlay import BLAME_CODE
from gpuhealth.controller.incidents.settings import JudgeSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import desired_node
from gpuhealth.controller.taints.settings import PolicySettings
from gpuhealth.protocol import Condition, Event
from tests.support.clock import FakeClock
from tests.support.protocol import allocation, gpu_uuid, hello, next_seq, snapshot, transition

REPEATED = Condition(
    reason="XidRepeated", code="xid-repeated", severity="degraded", action="RUN_DIAGNOSTICS", xid=13
)


class Jobs:
    """Pod ``<job>-<n>`` belongs to Job ``<job>``."""

    def __init__(self) -> None:
        self.lookups = 0

    async def job(self, namespace: str, pod: str) -> JobRef | None:
        self.lookups += 1
        return JobRef(namespace, "Job", pod.rsplit("-", 1)[0])


class Events:
    def __init__(self) -> None:
        self.written: list[tuple[str, tuple[str, ...]]] = []

    async def job_incident(
        self, job: JobRef, pods: Sequence[str], message: str, now: datetime
    ) -> None:
        self.written.append((job.key, tuple(pods)))


def xid(clock: FakeClock, node: str, index: int = 0, code: int = 13) -> Event:
    return Event(
        seq=next_seq(),
        node=node,
        at=clock.now(),
        kind="xid",
        gpu_uuid=gpu_uuid(index, node),
        gpu_index=index,
        previous="healthy",
        current="healthy",
        xid=code,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, **kw: object) -> tuple[IncidentJudge, Fleet, Events]:
    fleet = Fleet(clock=clock)
    events = Events()
    judge = IncidentJudge(
        JudgeSettings(**kw),  # type: ignore[arg-type]
        IncidentBook(),
        fleet,
        clock=clock,
        jobs=Jobs(),
        events=events,
        may_write=lambda: True,
    )
    return judge, fleet, events


def run_job(judge: IncidentJudge, job: str, nodes: Sequence[str]) -> None:
    for i, node in enumerate(nodes):
        judge.on_connect(node, hello(node, 1))
        judge.on_message(
            node, snapshot(node, 1, allocations=[allocation(gpu_uuid(0, node), f"{job}-{i}")])
        )


def test_the_agents_verdicts_are_not_walked_by_the_garbage_collector(clock: FakeClock) -> None:
    """One view per GPU of the fleet, untracked (a full collection at 19,000 nodes walked
    152,000 of them); one with no conditions shares the one empty list."""
    import gc

    from gpuhealth.controller.fleet.model import NOTHING

    judge, _, _ = make(clock)
    run_job(judge, "train", ["n1", "n2"])
    views = list(judge._agent.values())
    assert len(views) == 2
    assert not any(gc.is_tracked(v) for v in views)
    assert all(v.conditions is NOTHING for v in views)


async def test_sixteen_node_crash_is_one_job_incident_and_taints_nothing(clock: FakeClock) -> None:
    judge, fleet, events = make(clock)
    nodes = [f"n{i}" for i in range(16)]
    run_job(judge, "train", nodes)
    await judge.step()
    for node in nodes:
        for _ in range(3):
            judge.on_message(node, xid(clock, node))
    await judge.step()
    [inc] = judge.book.list()
    assert inc.kind == "job" and inc.subjects.owner == "ns/Job/train"
    assert inc.decision == "no taint" and inc.evidence["nodes"] == 16
    assert events.written == [("ns/Job/train", tuple(sorted(f"ns/train-{i}" for i in range(16))))]
    for node in nodes:
        desired = desired_node(fleet.node_health(node), PolicySettings(), Keys("gpuhealth.io"))
        assert desired.taints == frozenset() and desired.state == "healthy"
    assert judge.blamed() == {}


async def test_agent_escalation_is_the_judges(clock: FakeClock) -> None:
    """The agent's xid-repeated (a crash-looping job) never degrades the node by itself."""
    judge, fleet, _ = make(clock)
    run_job(judge, "train", ["a"])
    judge.on_message("a", transition("a", 0, "degraded", REPEATED))
    g = fleet.node_health("a").gpus[0]
    assert g.state == "healthy" and g.conditions == ()
    off, fleet_off, _ = make(clock, judge_agent_escalation=False)
    run_job(off, "train", ["a"])
    off.on_message("a", transition("a", 0, "degraded", REPEATED))
    assert fleet_off.node_health("a").gpus[0].state == "degraded"


async def test_one_gpu_under_three_jobs_is_blamed_then_expires(clock: FakeClock) -> None:
    judge, fleet, _ = make(clock, blame_hold_s=7200.0)
    judge.on_connect("bad", hello("bad", 2))
    for k, job in enumerate(["a", "b", "c"]):
        allocs = [allocation(gpu_uuid(0, "bad"), f"{job}-0")]
        judge.on_message("bad", snapshot("bad", 2, allocations=allocs))
        judge.on_message("bad", xid(clock, "bad", code=31))
        await judge.step()
        if k < 2:
            assert judge.blamed() == {}
        clock.advance(600)
    [inc] = judge.book.list()
    assert inc.kind == "gpu" and inc.subjects.gpus == ("bad/GPU-bad-0",)
    assert "3 different jobs" in inc.reason
    g = fleet.node_health("bad").gpus[0]
    assert g.state == "unhealthy" and g.conditions[-1].code == BLAME_CODE
    assert g.conditions[-1].action == "RUN_DIAGNOSTICS"
    desired = desired_node(fleet.node_health("bad"), PolicySettings(), Keys("gpuhealth.io"))
    assert {t.value for t in desired.taints} == {BLAME_CODE}
    # The agent's next snapshot keeps the blame (the controller's word)...
    judge.on_message("bad", snapshot("bad", 2))
    assert fleet.node_health("bad").gpus[0].state == "unhealthy"
    # ... until the hold period passes without a fault.
    clock.advance(7200)
    await judge.decide()
    assert judge.blamed() == {} and fleet.node_health("bad").gpus[0].state == "healthy"
    assert judge.book.list() == [] and judge.book.list(include_closed=True)[0].state == "closed"


async def test_crash_then_pod_gone_still_charged_to_its_job(clock: FakeClock) -> None:
    """The kubelet forgot the crashed pods before their XIDs arrived: the last pod counts."""
    judge, _, _ = make(clock)
    nodes = ["a", "b"]
    run_job(judge, "train", nodes)
    for node in nodes:
        judge.on_message(node, snapshot(node, 1))  # the pods left the GPUs
    clock.advance(30)
    for node in nodes:
        judge.on_message(node, xid(clock, node))
    await judge.step()
    assert [i.subjects.owner for i in judge.book.list()] == ["ns/Job/train"]


async def test_replayed_old_reports_keep_their_age(clock: FakeClock) -> None:
    judge, _, _ = make(clock)
    run_job(judge, "train", ["a", "b"])
    old = clock.now() - timedelta(hours=5)
    for node in ("a", "b"):
        judge.on_message(node, msgspec.structs.replace(xid(clock, node), at=old))
    await judge.step()
    assert judge.book.list() == []


async def test_job_incident_closes_when_quiet(clock: FakeClock) -> None:
    judge, _, _ = make(clock, incident_close_s=600.0, job_window_s=300.0)
    run_job(judge, "train", ["a", "b"])
    for node in ("a", "b"):
        judge.on_message(node, xid(clock, node))
    await judge.step()
    assert len(judge.book.list()) == 1
    clock.advance(301)
    await judge.decide()
    assert len(judge.book.list()) == 1
    clock.advance(600)
    await judge.decide()
    assert judge.book.list() == []


async def test_disabled_passes_everything_through(clock: FakeClock) -> None:
    judge, fleet, _ = make(clock, enabled=False)
    run_job(judge, "train", ["a", "b"])
    judge.on_message("a", transition("a", 0, "degraded", REPEATED))
    for node in ("a", "b"):
        judge.on_message(node, xid(clock, node))
    await judge.step()
    assert judge.book.list() == [] and fleet.node_health("a").gpus[0].state == "degraded"


async def test_blame_lifted_once_the_remediation_loop_reset_the_gpu(clock: FakeClock) -> None:
    from types import SimpleNamespace

    episodes: list[object] = []
    fleet = Fleet(clock=clock)
    judge = IncidentJudge(
        JudgeSettings(),
        IncidentBook(),
        fleet,
        clock=clock,
        jobs=Jobs(),
        episodes=lambda: episodes,  # type: ignore[arg-type,return-value]
    )
    judge.on_connect("bad", hello("bad", 1))
    for job in ["a", "b", "c"]:
        judge.on_message(
            "bad", snapshot("bad", 1, allocations=[allocation(gpu_uuid(0, "bad"), f"{job}-0")])
        )
        judge.on_message("bad", xid(clock, "bad", code=31))
        clock.advance(60)
    await judge.step()
    assert list(judge.blamed()) == [("bad", "GPU-bad-0")]
    clock.advance(600)
    episodes.append(
        SimpleNamespace(
            spec=SimpleNamespace(
                node_name="bad",
                fault=SimpleNamespace(gpus=[SimpleNamespace(uuid="GPU-bad-0", code=BLAME_CODE)]),
            ),
            status=SimpleNamespace(times=SimpleNamespace(remediated=clock.now())),
        )
    )
    await judge.decide()
    assert judge.blamed() == {}
    assert fleet.node_health("bad").gpus[0].state == "healthy"
    await judge.decide()  # the old reports are gone: not blamed again
    assert judge.blamed() == {}
    [closed] = judge.book.list(include_closed=True)
    assert "reset by the remediation loop" in closed.close_reason


@pytest.mark.parametrize(
    ("shape", "want_incidents", "want_tainted"),
    [
        ("job-64", ["job"], []),
        ("gpu-3-jobs", ["gpu"], ["bad"]),
        ("both", ["gpu", "job"], ["bad"]),
    ],
)
async def test_storm_shapes_end_to_end_taints_and_incidents(
    clock: FakeClock, shape: str, want_incidents: list[str], want_tainted: list[str]
) -> None:
    """The storm shapes through the judge, the fleet and the real policy: which nodes the
    policy would taint, and the incidents (64 nodes x 8 GPUs, every GPU of the job faulting)."""
    judge, fleet, _ = make(clock)
    nodes = [f"n{i}" for i in range(64)]
    if shape in ("job-64", "both"):
        for i, node in enumerate(nodes):
            judge.on_connect(node, hello(node, 8))
            allocs = [allocation(gpu_uuid(g, node), f"train-{i}") for g in range(8)]
            judge.on_message(node, snapshot(node, 8, allocations=allocs))
    if shape in ("gpu-3-jobs", "both"):
        judge.on_connect("bad", hello("bad", 8))
        for job in ("a", "b", "c"):
            allocs = [allocation(gpu_uuid(0, "bad"), f"{job}-0")]
            judge.on_message("bad", snapshot("bad", 8, allocations=allocs))
            judge.on_message("bad", xid(clock, "bad", code=31))
            await judge.step()
            clock.advance(120)
    if shape in ("job-64", "both"):
        for node in nodes:
            for g in range(8):
                judge.on_message(node, xid(clock, node, g, 13))
            judge.on_message(node, transition(node, 0, "degraded", REPEATED))
        await judge.step()
    assert sorted(i.kind for i in judge.book.list()) == want_incidents
    tainted = [
        rec.name
        for rec in fleet.nodes()
        if desired_node(fleet.node_health(rec.name), PolicySettings(), Keys("gpuhealth.io")).taints
    ]
    assert tainted == want_tainted


async def test_an_operators_resolve_lifts_the_blame_and_old_reports_stop_counting(
    clock: FakeClock,
) -> None:
    from gpuhealth.controller.incidents.lifecycle import OnCallAction

    judge, fleet, _ = make(clock, blame_hold_s=7200.0)
    judge.on_connect("bad", hello("bad", 2))
    for job in ["a", "b", "c"]:
        allocs = [allocation(gpu_uuid(0, "bad"), f"{job}-0")]
        judge.on_message("bad", snapshot("bad", 2, allocations=allocs))
        judge.on_message("bad", xid(clock, "bad", code=31))
        await judge.step()
        clock.advance(60)
    (blamed,) = judge.book.list(kind="gpu")
    judge.resolve(blamed, OnCallAction("alice", clock.now(), "reseated"))
    assert judge.blamed() == {} and fleet.node_health("bad").gpus[0].state == "healthy"
    closed = judge.book.get(blamed.id)
    assert closed is not None and closed.close_reason == "resolved by alice: reseated"
    # the reports from before stay in the window, but no longer count
    await judge.decide()
    assert judge.blamed() == {}
    # new faults under three jobs blame it again
    for job in ["d", "e", "f"]:
        clock.advance(60)
        allocs = [allocation(gpu_uuid(0, "bad"), f"{job}-0")]
        judge.on_message("bad", snapshot("bad", 2, allocations=allocs))
        judge.on_message("bad", xid(clock, "bad", code=31))
        await judge.step()
    assert list(judge.blamed()) == [("bad", gpu_uuid(0, "bad"))]
