"""Network blame: the pure decisions (which reports a faulting rail explains, which rails a job
incident names), the rails' fault spells from Snapshots, and the judge at work (real Fleet,
fake clock, a fake pod lookup): a GPU behind a flapping rail is not blamed for the crashes the
rail caused, another GPU in the same shape is, and the job incident names the rail."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuhealth.controller.incidents.blame import JobFinding, XidOccurrence
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.metrics import IncidentCollector
from gpuhealth.controller.incidents.network_blame import (
    MAX_NAMED_RAILS,
    MAX_SPELLS_PER_PORT,
    RailHistory,
    RailSpell,
    explained,
    job_rails,
    rail_note,
    unexplained,
)
from gpuhealth.controller.incidents.overlay import BLAME_CODE
from tests.support.clock import FakeClock
from tests.support.protocol import allocation, gpu_uuid, hello, nic, snapshot
from tests.unit.controller.incidents.test_judge import make, xid


def registry(judge: IncidentJudge) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(IncidentCollector(judge.book, judge.stats))
    return reg


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


SPELL = RailSpell("n7", "mlx5_0/1", frozenset({"G0", "G1"}), start=100.0, end=160.0)


def report(at: float, node: str = "n7", gpu: str = "G0") -> XidOccurrence:
    return XidOccurrence(at=at, node=node, gpu=gpu, xid=13, xid_class="app-fault", job="ns/Job/a")


@pytest.mark.parametrize(
    ("r", "grace", "explains"),
    [
        (report(130.0), 0.0, True),  # during the spell
        (report(100.0), 0.0, True),  # at its start
        (report(160.0), 0.0, True),  # at its end
        (report(190.0), 30.0, True),  # within the grace after it
        (report(70.0), 30.0, True),  # within the grace before it (the XID came first)
        (report(191.0), 30.0, False),  # past the grace
        (report(69.0), 30.0, False),
        (report(130.0, gpu="G2"), 30.0, False),  # a GPU not behind the port
        (report(130.0, node="n8"), 30.0, False),  # the same GPU UUID on another node
    ],
)
def test_explained(r: XidOccurrence, grace: float, explains: bool) -> None:
    assert (explained(r, [SPELL], grace) is SPELL) is explains


def test_unexplained_keeps_order_and_every_report_without_spells() -> None:
    rs = [report(50.0), report(130.0), report(130.0, gpu="G2"), report(400.0)]
    assert unexplained(rs, [], 0.0) == rs
    assert unexplained(rs, [SPELL], 0.0) == [rs[0], rs[2], rs[3]]


def finding(nodes: tuple[str, ...], first: float, last: float) -> JobFinding:
    return JobFinding(
        job="ns/Job/a",
        xid_class="app-fault",
        nodes=nodes,
        gpus=(),
        pods=(),
        xids=(13,),
        reports=1,
        first_at=first,
        last_at=last,
    )


@pytest.mark.parametrize(
    ("f", "grace", "rails"),
    [
        (finding(("n1", "n7"), 150.0, 170.0), 0.0, ("n7/mlx5_0/1",)),
        (finding(("n1", "n7"), 200.0, 210.0), 60.0, ("n7/mlx5_0/1",)),
        (finding(("n1", "n7"), 200.0, 210.0), 30.0, ()),  # the crash came too late
        (finding(("n1", "n2"), 150.0, 170.0), 60.0, ()),  # the rail is not the job's node's
        (finding(("n7",), 0.0, 99.0), 0.0, ()),  # before the spell
    ],
)
def test_job_rails(f: JobFinding, grace: float, rails: tuple[str, ...]) -> None:
    other = RailSpell("n9", "mlx5_1/1", frozenset(), 150.0, 150.0)
    assert job_rails(f, [SPELL, other], grace) == rails


def test_rail_note() -> None:
    assert rail_note(()) == ""
    assert "rail n7/mlx5_0/1 went down or flapped" in rail_note(("n7/mlx5_0/1",))
    many = tuple(f"n{i}/mlx5_0/1" for i in range(MAX_NAMED_RAILS + 3))
    note = rail_note(many)
    assert "and 3 more" in note and many[MAX_NAMED_RAILS] not in note


def test_history_from_snapshots(clock: FakeClock) -> None:
    """Flaps extend one spell while they come within the merge time; a verdict keeps it open
    until a Snapshot without it; a flap later opens the next spell; a disconnection ends it."""
    h = RailHistory(merge_s=60.0, horizon_s=3600.0)
    wall, mono = clock.now(), clock.monotonic()
    h.observe("n7", [nic("n7", flaps=1, last_flap=wall - timedelta(seconds=10))], mono, wall)
    [s] = h.spells(mono)
    assert (s.start, s.end, s.rail, s.codes) == (mono - 10, mono - 10, "n7/mlx5_0/1", ())
    assert s.gpus == {gpu_uuid(0, "n7")}
    flapping = nic("n7", verdicts=["rail-flapping"], flaps=3, last_flap=wall)
    h.observe("n7", [flapping], mono + 20, wall + timedelta(seconds=20))
    [s] = h.spells(mono + 500)  # ongoing: lasts until now
    assert (s.start, s.end, s.codes) == (mono - 10, mono + 500, ("rail-flapping",))
    h.observe("n7", [nic("n7", flaps=3, last_flap=wall)], mono + 600, wall + timedelta(seconds=600))
    [s] = h.spells(mono + 1000)  # the verdict cleared: the spell ended
    assert s.end == mono + 20
    later = wall + timedelta(seconds=900)
    h.observe("n7", [nic("n7", verdicts=["rail-down"], last_flap=later)], mono + 900, later)
    first, second = h.spells(mono + 1000)
    assert first.end == mono + 20 and (second.start, second.end) == (mono + 900, mono + 1000)
    h.disconnected("n7")
    assert h.spells(mono + 2000)[1].end == mono + 900
    h.forget("n7")
    assert h.spells(mono + 2000) == []


def test_history_ignores_slow_links_and_is_bounded(clock: FakeClock) -> None:
    """A slow or noisy link opens no spell; a port keeps at most its newest
    ``MAX_SPELLS_PER_PORT``; spells past the horizon go, also of a node that sends nothing."""
    h = RailHistory(merge_s=1.0, horizon_s=1000.0)
    wall, mono = clock.now(), clock.monotonic()
    slow = nic("n1", verdicts=["rail-degraded-rate", "rail-errors"])
    h.observe("n1", [slow], mono, wall)
    assert h.spells(mono) == []
    for k in range(MAX_SPELLS_PER_PORT + 5):
        at = wall + timedelta(seconds=10 * k)
        h.observe("n1", [nic("n1", last_flap=at)], mono + 10 * k, at)
    kept = h.spells(mono + 300)
    assert len(kept) == MAX_SPELLS_PER_PORT and kept[0].start == mono + 50
    after = h.spells(mono + 1100)  # those that ended before mono + 100 are gone
    assert [s.start for s in after] == [mono + 10 * k for k in range(10, MAX_SPELLS_PER_PORT + 5)]
    assert h.spells(mono + 1300) == []  # past the horizon, with no Snapshot since


async def test_gpu_behind_a_flapping_rail_is_not_blamed_and_the_job_incident_names_it(
    clock: FakeClock,
) -> None:
    """Three jobs crash on a node whose rail mlx5_0 port 1 (GPU 0 behind it) flaps; a GPU on
    another node faults under three jobs too, with healthy rails: that one is blamed, GPU 0
    is not, and the incident of the job spanning both nodes names the rail."""
    judge, fleet, _ = make(clock, blame_hold_s=7200.0, rail_grace_s=120.0)
    for node in ("n7", "bad"):
        judge.on_connect(node, hello(node, 2))
    for job in ("a", "b", "c"):
        pods = {"n7": f"{job}-0", "bad": f"{job}-1"}
        flapping = nic("n7", verdicts=["rail-flapping"], flaps=4, last_flap=clock.now())
        for node, pod in pods.items():
            judge.on_message(
                node,
                snapshot(
                    node,
                    2,
                    allocations=[allocation(gpu_uuid(0, node), pod)],
                    nics=[flapping] if node == "n7" else [nic(node)],
                ),
            )
            judge.on_message(node, xid(clock, node))
        await judge.step()
        clock.advance(600)
    assert list(judge.blamed()) == [("bad", gpu_uuid(0, "bad"))]
    assert fleet.node_health("n7").gpus[0].conditions == ()
    assert (judge.stats.rail_explained, judge.stats.rails_faulting) == (3, 1)
    text = generate_latest(registry(judge)).decode()
    assert "gpuhealth_incident_rail_explained_reports 3.0" in text
    assert "gpuhealth_incident_rails_faulting 1.0" in text
    jobs = judge.book.list(kind="job")
    assert [i.subjects.rails for i in jobs] == [("n7/mlx5_0/1",)] * 3
    assert all("rail n7/mlx5_0/1 went down or flapped" in i.reason for i in jobs)
    assert all(i.evidence["rails"] == 1 for i in jobs)
    [gpu] = judge.book.list(kind="gpu")
    assert gpu.subjects.gpus == (f"bad/{gpu_uuid(0, 'bad')}",)
    assert fleet.node_health("bad").gpus[0].conditions[-1].code == BLAME_CODE


async def test_without_the_rail_the_same_gpu_is_blamed(clock: FakeClock) -> None:
    """The control: the same three crashes with the rail healthy blame GPU 0 (so it is the
    rail that spares it), and crashes long after the rail's last flap count again."""
    judge, _, _ = make(clock, rail_grace_s=120.0)
    judge.on_connect("n7", hello("n7", 2))
    old_flap = clock.now() - timedelta(seconds=3600)
    for job in ("a", "b", "c"):
        judge.on_message(
            "n7",
            snapshot(
                "n7",
                2,
                allocations=[allocation(gpu_uuid(0, "n7"), f"{job}-0")],
                nics=[nic("n7", flaps=0, last_flap=old_flap)],
            ),
        )
        judge.on_message("n7", xid(clock, "n7"))
        await judge.step()
        clock.advance(600)
    assert list(judge.blamed()) == [("n7", gpu_uuid(0, "n7"))]
    assert judge.book.list(kind="job") == []
