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


def xid(clock: FakeClock, node: str, index: int = 0, code: int = 13, detail: str = "") -> Event:
    return Event(
        detail=detail,
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
    """The agent's xid-repeated (a crash-looping job) never degrades the node by itself; it
    stays on the GPU as information (an input shown, not dropped)."""
    judge, fleet, _ = make(clock)
    run_job(judge, "train", ["a"])
    judge.on_message("a", transition("a", 0, "degraded", REPEATED))
    g = fleet.node_health("a").gpus[0]
    assert g.state == "healthy"
    assert [(c.code, c.severity, c.action) for c in g.conditions] == [
        ("xid-repeated", "healthy", "NONE")
    ]
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


XID31_TEXT = "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"
XID13_TEXT = "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Illegal Instruction Encoding"


def taints_of(fleet: Fleet, node: str) -> set[tuple[str, str]]:
    desired = desired_node(fleet.node_health(node), PolicySettings(), Keys("gpuhealth.io"))
    return {(t.value, t.effect) for t in desired.taints}


async def test_a_bad_gpu_under_one_restarting_jobset_is_suspected_then_blamed(
    clock: FakeClock,
) -> None:
    """A 16-node JobSet (8 GPUs a node, one pod a node) whose node-3 GPU 5 raises XID 31 on
    every attempt, then every rank aborts with XID 43; the JobSet restarts every 15 minutes
    with the same key. One job incident naming the first fault per attempt; after the second
    attempt node-3 GPU 5 is suspected (soft), after the third blamed (hard); no other node is
    tainted."""
    judge, fleet, _ = make(clock)
    nodes = [f"node-{i}" for i in range(16)]
    bad = gpu_uuid(5, "node-3")
    for node in nodes:
        judge.on_connect(node, hello(node, 8))
    for k in range(3):
        for i, node in enumerate(nodes):  # the attempt's pods (new names, the same JobSet)
            allocs = [allocation(gpu_uuid(g, node), f"train-a{k}n{i}") for g in range(8)]
            judge.on_message(node, snapshot(node, 8, allocations=allocs))
        await judge.step()
        judge.on_message("node-3", xid(clock, "node-3", 5, 31, XID31_TEXT))
        clock.advance(0.5)
        for node in nodes:
            for g in range(8):
                judge.on_message(node, xid(clock, node, g, 43))
        await judge.step()
        [incident] = judge.book.list(kind="job")
        assert incident.key == "ns/Job/train" and incident.evidence["nodes"] == 16
        assert f"#{k + 1} node-3/{bad} XID 31" in incident.reason
        state = fleet.node_health("node-3").gpus[5]
        if k == 0:
            assert judge.blamed() == {} and taints_of(fleet, "node-3") == set()
        elif k == 1:
            assert state.state == "degraded" and state.conditions[-1].code == "gpu-suspected"
            assert taints_of(fleet, "node-3") == {("gpu-suspected", "PreferNoSchedule")}
            [gpu_inc] = judge.book.list(kind="gpu")
            assert gpu_inc.decision.startswith("gpu suspected") and gpu_inc.blame is not None
            assert gpu_inc.blame.suspected
        else:
            assert state.state == "unhealthy" and state.conditions[-1].code == BLAME_CODE
            assert ("gpu-blamed", "NoSchedule") in taints_of(fleet, "node-3")
            [gpu_inc] = judge.book.list(kind="gpu")
            assert gpu_inc.blame is not None and not gpu_inc.blame.suspected
            assert "the first to fault in 3 attempts" in gpu_inc.reason
        assert all(taints_of(fleet, n) == set() for n in nodes if n != "node-3")
        clock.advance(900)


async def test_a_one_node_job_retried_on_the_same_gpu(clock: FakeClock) -> None:
    judge, fleet, _ = make(clock)
    judge.on_connect("solo", hello("solo", 1))
    for k in range(3):
        allocs = [allocation(gpu_uuid(0, "solo"), f"solo-{k}")]
        judge.on_message("solo", snapshot("solo", 1, allocations=allocs))
        for _ in range(4):
            judge.on_message("solo", xid(clock, "solo", 0, 13, XID13_TEXT))
        await judge.step()
        clock.advance(120)
    assert judge.book.list(kind="job") == []  # one node: no job incident
    [inc] = judge.book.list(kind="gpu")
    assert "GPU-solo-0" in inc.key and not inc.blame.suspected  # type: ignore[union-attr]
    assert fleet.node_health("solo").gpus[0].state == "unhealthy"


@pytest.mark.parametrize("pods", ["unknown", "none"])
async def test_a_crash_looping_job_with_podresources_down(clock: FakeClock, pods: str) -> None:
    """A 16-node job (8 GPUs a node) crash-looping every 15 minutes, every GPU faulting with
    XID 13, while no agent can read PodResources. Said so on the wire ("unknown"): nothing is
    blamed, no node tainted, the agent's own xid-repeated stands, the API's node says why.
    Read as "no pods" (an agent without the field): the storm, 128 GPUs blamed."""
    judge, fleet, _ = make(clock)
    nodes = [f"node-{i}" for i in range(16)]
    why = "PodResources: PodResources socket /var/lib/kubelet/pod-resources/kubelet.sock missing"
    for node in nodes:
        judge.on_connect(node, hello(node, 8))
        snap = snapshot(node, 8)
        if pods == "unknown":
            snap = msgspec.structs.replace(snap, allocations_unknown=why)
        judge.on_message(node, snap)
    for _ in range(4):
        for node in nodes:
            for g in range(8):
                judge.on_message(node, xid(clock, node, g, 13, XID13_TEXT))
        await judge.step()
        clock.advance(900)
    judge.on_message("node-0", transition("node-0", 0, "degraded", REPEATED))
    tainted = [n for n in nodes if taints_of(fleet, n)]
    if pods == "none":
        assert len(judge.blamed()) == 128 and len(tainted) == 16
        return
    assert judge.blamed() == {} and judge.book.list() == []
    assert judge.allocations_unknown() == {n: why for n in nodes}
    # the agent's per-GPU rule still applies where the controller cannot see the jobs
    assert tainted == ["node-0"]
    assert fleet.node_health("node-0").gpus[0].conditions[-1].severity == "degraded"
    assert fleet.node("node-0").allocations_unknown == why  # type: ignore[union-attr]
    # PodResources back: the node's reports count again, the agent's verdict is demoted
    judge.on_message("node-0", snapshot("node-0", 8))
    judge.on_message("node-0", transition("node-0", 0, "degraded", REPEATED))
    assert "node-0" not in judge.allocations_unknown() and taints_of(fleet, "node-0") == set()


async def test_a_successor_adopts_a_suspicion_as_a_suspicion(clock: FakeClock) -> None:
    """The soft taint survives a failover as the soft taint (not a blame, not nothing)."""
    judge, fleet, _ = make(clock)
    judge.on_connect("solo", hello("solo", 1))
    for k in range(2):
        judge.on_message(
            "solo", snapshot("solo", 1, allocations=[allocation(gpu_uuid(0, "solo"), f"solo-{k}")])
        )
        judge.on_message("solo", xid(clock, "solo", 0, 13, XID13_TEXT))
        await judge.step()
        clock.advance(120)
    [inc] = judge.book.list(kind="gpu")
    successor, fleet2, _ = make(clock)
    successor.adopt([inc])
    successor.on_connect("solo", hello("solo", 1))
    successor.on_message("solo", snapshot("solo", 1))
    g = fleet2.node_health("solo").gpus[0]
    assert g.state == "degraded" and g.conditions[-1].code == "gpu-suspected"
    assert taints_of(fleet2, "solo") == {("gpu-suspected", "PreferNoSchedule")}
    assert fleet.node_health("solo").gpus[0].conditions[-1] == g.conditions[-1]
