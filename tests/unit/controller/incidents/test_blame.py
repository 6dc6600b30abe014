"""The job-or-GPU decision, table-tested with storm shapes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.controller.incidents.blame import (
    UNKNOWN_JOB,
    XidOccurrence,
    by_job,
    gpu_reason,
    job_attempts,
    job_reason,
    judge,
    sm_location,
)
from gpuhealth.controller.incidents.settings import JudgeSettings

S = JudgeSettings()
NOW = 10_000.0


def job_crash(
    job: str, nodes: int, *, at: float = NOW - 5, xid: int = 13, gpus: int = 8
) -> list[XidOccurrence]:
    """One job on ``nodes`` nodes dies: every GPU of it logs ``xid`` (several lines each)."""
    return [
        XidOccurrence(
            at=at + line * 0.01,
            node=f"{job}-n{n}",
            gpu=f"GPU-{job}-{n}-{g}",
            xid=xid,
            xid_class=S.class_of(xid) or "",
            job=f"ml/Job/{job}",
            pod=f"ml/{job}-{n}",
        )
        for n in range(nodes)
        for g in range(gpus)
        for line in range(3)
    ]


def gpu_under(
    jobs: list[str | None],
    *,
    node: str = "bad",
    gpu: str = "GPU-bad",
    xid: int = 31,
    start: float = NOW - 1800,
    step: float = 300,
) -> list[XidOccurrence]:
    """One GPU faults once under each of ``jobs`` (None: nothing held the GPU)."""
    return [
        XidOccurrence(
            at=start + i * step,
            node=node,
            gpu=gpu,
            xid=xid,
            xid_class=S.class_of(xid) or "",
            job=None if j is None else f"ml/Job/{j}",
        )
        for i, j in enumerate(jobs)
    ]


@dataclass(frozen=True)
class Case:
    name: str
    reports: list[XidOccurrence]
    jobs: list[str]
    """Expected job incident keys."""
    gpus: list[str]
    """Expected blamed ``node/uuid``."""


CASES = [
    Case("one job on 64 nodes", job_crash("train", 64), ["ml/Job/train/app-fault"], []),
    Case(
        "one job on 16 nodes, aborts",
        job_crash("train", 16, xid=43),
        ["ml/Job/train/app-abort"],
        [],
    ),
    Case(
        "job crash-looping 6 times on 16 nodes",
        [r for k in range(6) for r in job_crash("train", 16, at=NOW - 3000 + k * 500)],
        ["ml/Job/train/app-fault"],
        [],
    ),
    Case("one job on one node is nobody's incident", job_crash("solo", 1), [], []),
    Case("one GPU under 3 jobs", gpu_under(["a", "b", "c"]), [], ["bad/GPU-bad"]),
    Case("one GPU under 2 jobs is not enough", gpu_under(["a", "b"]), [], []),
    # Five attempts of one job, the same GPU first each time: blamed (it used to pass, the
    # restarts keeping the job's key).
    Case("one GPU first in 5 attempts of one job", gpu_under(["a"] * 5), [], ["bad/GPU-bad"]),
    Case(
        "one GPU under 2 jobs and once with no job",
        gpu_under(["a", "b", None]),
        [],
        ["bad/GPU-bad"],
    ),
    Case("aborts never blame a GPU", gpu_under(["a", "b", "c"], xid=43), [], []),
    Case(
        "faults older than the window do not count",
        gpu_under(["a", "b", "c"], start=NOW - 5000, step=1000),
        [],
        [],
    ),
    Case(
        "both at once: a 64-node crash and a GPU under 3 jobs",
        job_crash("train", 64) + gpu_under(["a", "b", "c"]),
        ["ml/Job/train/app-fault"],
        ["bad/GPU-bad"],
    ),
    Case(
        "both at once, the bad GPU inside the crashed job",
        job_crash("train", 64) + gpu_under(["a", "b"], node="train-n3", gpu="GPU-train-3-0"),
        ["ml/Job/train/app-fault"],
        ["train-n3/GPU-train-3-0"],
    ),
    Case(
        "two jobs crash at once",
        job_crash("a", 8) + job_crash("b", 8, xid=31),
        ["ml/Job/a/app-fault", "ml/Job/b/app-fault"],
        [],
    ),
    Case("no-job reports in one burst count once", gpu_under([None, None, None], step=1), [], []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_storm_shapes(case: Case) -> None:
    j = judge(case.reports, NOW, S)
    assert [f.key for f in j.jobs] == case.jobs
    assert [f.key for f in j.gpus] == case.gpus


def test_findings_say_why() -> None:
    j = judge(job_crash("train", 16) + gpu_under(["a", "b", "c"]), NOW, S)
    [job] = j.jobs
    assert len(job.nodes) == 16 and len(job.gpus) == 128 and job.reports == 384
    assert "16 nodes" in job_reason(job, S) and "nothing tainted" in job_reason(job, S)
    [gpu] = j.gpus
    assert gpu.contexts == 3 and "3 different jobs" in gpu_reason(gpu, S)


def test_thresholds_are_settings() -> None:
    s = JudgeSettings(gpu_min_jobs=2, job_min_nodes=20)
    j = judge(job_crash("train", 16) + gpu_under(["a", "b"]), NOW, s)
    assert j.jobs == () and [g.key for g in j.gpus] == ["bad/GPU-bad"]


def test_future_reports_are_ignored() -> None:
    assert judge(job_crash("t", 4, at=NOW + 10), NOW, S).jobs == ()


def test_one_crash_of_several_classes_is_one_finding_per_job() -> None:
    j = judge(job_crash("train", 16) + job_crash("train", 16, xid=43), NOW, S)
    assert [f.key for f in j.jobs] == ["ml/Job/train/app-abort", "ml/Job/train/app-fault"]
    [merged] = by_job(j.jobs)
    assert merged.job == "ml/Job/train" and merged.xid_class == "app-abort,app-fault"
    assert len(merged.nodes) == 16 and merged.reports == 768 and merged.xids == (13, 43)


# -- the same GPU first, attempt after attempt ------------------------------------------------

# The driver's text of real XID lines (NVIDIA's XID catalog, "XID 13: Graphics Engine
# Exception" and "XID 31: GPU memory page fault"), as the agent sends them in ``Event.detail``.
XID13_TEXT = "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Illegal Instruction Encoding"
XID31_TEXT = (
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f1b_6e000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
)
JOBSET = "ml/JobSet/train"


def attempt(
    at: float,
    *,
    first: tuple[int, int] | None = (3, 5),
    nodes: int = 16,
    gpus: int = 8,
    job: str = JOBSET,
    xid: int = 31,
    everyone_faults: bool = False,
) -> list[XidOccurrence]:
    """One attempt of a 16-node JobSet: GPU ``first`` (node, index) raises ``xid``, then every
    rank aborts with XID 43 within 3 s; ``everyone_faults``: every GPU raises ``xid`` within
    50 ms (an application bug on every rank), no GPU first."""
    out: list[XidOccurrence] = []
    if first is not None and not everyone_faults:
        n, g = first
        out.append(
            XidOccurrence(
                at=at,
                node=f"node-{n}",
                gpu=f"GPU-{n}-{g}",
                xid=xid,
                xid_class="app-fault",
                job=job,
                pod=f"ml/train-{n}",
                detail=XID13_TEXT if xid == 13 else XID31_TEXT,
            )
        )
    for n in range(nodes):
        for g in range(gpus):
            code, cls, delay = (
                (xid, "app-fault", 0.05 * g / gpus)
                if everyone_faults
                else (
                    43,
                    "app-abort",
                    0.5 + 2.5 * (n * gpus + g) / (nodes * gpus),
                )
            )
            out.append(
                XidOccurrence(
                    at=at + delay,
                    node=f"node-{n}",
                    gpu=f"GPU-{n}-{g}",
                    xid=code,
                    xid_class=cls,
                    job=job,
                    pod=f"ml/train-{n}",
                    detail=XID13_TEXT if code == 13 else "",
                )
            )
    return out


def restarts(k: int, *, every: float = 900.0, **kw: object) -> list[XidOccurrence]:
    """``k`` attempts, ``every`` seconds apart (a JobSet crash-looping every 15 minutes)."""
    return [r for i in range(k) for r in attempt(NOW - 10 - (k - 1 - i) * every, **kw)]  # type: ignore[arg-type]


def one_node_job(k: int, *, gpu: str = "GPU-solo-0", every: float = 120.0) -> list[XidOccurrence]:
    """A one-node, one-GPU Job retried ``k`` times on the same GPU, XID 13 each time."""
    return [
        XidOccurrence(
            at=NOW - 10 - (k - 1 - i) * every + line * 0.01,
            node="solo",
            gpu=gpu,
            xid=13,
            xid_class="app-fault",
            job="ml/Job/solo",
            pod="ml/solo-abcde",
            detail=XID13_TEXT,
        )
        for i in range(k)
        for line in range(4)  # one crash logs an XID 13 per SM
    ]


@dataclass(frozen=True)
class Repeat:
    name: str
    reports: list[XidOccurrence]
    blamed: list[str]
    suspected: list[str]
    jobs: list[str]


BAD = "node-3/GPU-3-5"
REPEATS = [
    Repeat("one attempt: the job's", restarts(1), [], [], [JOBSET]),
    Repeat("two attempts, the same GPU first: suspected", restarts(2), [], [BAD], [JOBSET]),
    Repeat("three attempts, the same GPU first: blamed", restarts(3), [BAD], [], [JOBSET]),
    Repeat("three attempts of XID 13 first", restarts(3, xid=13), [BAD], [], [JOBSET]),
    Repeat(
        "three attempts, every rank faults at once: no GPU",
        restarts(3, everyone_faults=True),
        [],
        [],
        [JOBSET],
    ),
    Repeat(
        "three attempts, a different GPU first each time",
        [r for i in range(3) for r in attempt(NOW - 10 - i * 900, first=(i, i))],
        [],
        [],
        [JOBSET],
    ),
    Repeat(
        "three attempts, the first two out of the window",
        restarts(3, every=4000),
        [],
        [],
        [JOBSET],
    ),
    Repeat("a one-node Job retried 3 times", one_node_job(3), ["solo/GPU-solo-0"], [], []),
    Repeat("a one-node Job retried twice", one_node_job(2), [], ["solo/GPU-solo-0"], []),
    Repeat(
        "a crash's lines over 40 s are one attempt",
        one_node_job(3, every=20),
        [],
        [],
        [],
    ),
    Repeat(
        "allocations unknown: a crash-looping job blames nothing, opens nothing",
        [replace(r, job=UNKNOWN_JOB) for r in restarts(6, everyone_faults=True) + restarts(3)],
        [],
        [],
        [],
    ),
]


@pytest.mark.parametrize("case", REPEATS, ids=[c.name for c in REPEATS])
def test_the_same_gpu_first_in_repeated_attempts(case: Repeat) -> None:
    j = judge(case.reports, NOW, S)
    assert [g.key for g in j.gpus if not g.suspected] == case.blamed
    assert [g.key for g in j.gpus if g.suspected] == case.suspected
    assert [f.job for f in by_job(j.jobs)] == case.jobs


def test_no_pods_is_not_unknown() -> None:
    """The storm job incidents prevent, when the GPUs' pods are not known (each burst with no
    job counts as one more context): 128 GPUs blamed. ``UNKNOWN_JOB`` is not that."""
    crash_loop = [
        replace(r, job=None, xid=13, xid_class="app-fault")
        for r in restarts(3, everyone_faults=True)
    ]
    assert len(judge(crash_loop, NOW, S).gpus) == 128
    unknown = [replace(r, job=UNKNOWN_JOB) for r in crash_loop]
    assert judge(unknown, NOW, S) == judge([], NOW, S)


def test_the_job_incident_names_each_attempts_first_fault() -> None:
    j = judge(restarts(3, xid=13), NOW, S)
    [job] = by_job(j.jobs)
    assert [a.key for a in job.attempts] == [BAD] * 3
    reason = job_reason(job, S)
    assert "first fault by attempt (3)" in reason
    assert reason.count(f"{BAD} XID 13 (GPC 4, TPC 1, SM 0)") == 3
    [gpu] = j.gpus
    assert gpu.first_in == (JOBSET, 3)
    assert f"the first to fault in 3 attempts of {JOBSET}" in gpu_reason(gpu, S)
    everyone = by_job(judge(restarts(2, everyone_faults=True), NOW, S).jobs)[0]
    assert job_reason(everyone, S).endswith("#1 no single GPU; #2 no single GPU")


def test_the_attempts_and_the_policy_are_settings() -> None:
    hard_at_once = JudgeSettings(suspect_attempts=2, blame_attempts=2)
    [g] = judge(restarts(2), NOW, hard_at_once).gpus
    assert g.key == BAD and not g.suspected
    patient = JudgeSettings(suspect_attempts=4, blame_attempts=6)
    assert judge(restarts(3), NOW, patient).gpus == ()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (XID13_TEXT, "GPC 4, TPC 1, SM 0"),
        ("Graphics Exception: ESR 0x504648=0x4 on (GPC 12,TPC 3,SM 1)", "GPC 12, TPC 3, SM 1"),
        (XID31_TEXT, ""),  # GPCCLIENT is not a GPC
        ("", ""),
    ],
)
def test_sm_location(text: str, want: str) -> None:
    assert sm_location(text) == want


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=400.0), min_size=0, max_size=30),
    gap_s=st.floats(min_value=1.0, max_value=300.0),
)
def test_attempts_split_exactly_at_gaps_longer_than_the_setting(
    gaps: list[float], gap_s: float
) -> None:
    s = JudgeSettings(attempt_gap_s=gap_s, first_fault_margin_s=0.5)
    at = [0.0]
    for g in gaps:
        at.append(at[-1] + g)
    rs = [
        XidOccurrence(at=t, node="n", gpu="GPU-0", xid=13, xid_class="app-fault", job="j")
        for t in at
    ]
    attempts = job_attempts("j", reversed(rs), s)
    real_gaps = [b - a for a, b in itertools.pairwise(at)]
    assert len(attempts) == 1 + sum(1 for g in real_gaps if g > gap_s)
    assert all(a.key == "n/GPU-0" for a in attempts)
    assert attempts[0].first_at == 0.0 and attempts[-1].last_at == at[-1]


@settings(max_examples=100, deadline=None)
@given(order=st.permutations(range(3)), every=st.floats(min_value=61.0, max_value=1200.0))
def test_the_verdict_does_not_depend_on_the_order_reports_arrive(
    order: list[int], every: float
) -> None:
    reports = restarts(3, every=every, nodes=4, gpus=2)
    chunks = [reports[i::3] for i in range(3)]
    shuffled = [r for i in order for r in chunks[i]]
    assert judge(shuffled, NOW, S) == judge(reports, NOW, S)


def test_the_job_incident_has_the_one_gpus_fault_beside_every_ranks_abort() -> None:
    [job] = by_job(judge(restarts(1), NOW, S).jobs)
    assert job.xid_class == "app-abort,app-fault" and job.xids == (31, 43)
    assert job_reason(job, S).startswith(
        "XID 31, 43 (app-abort,app-fault) on 128 GPU(s) of 16 nodes"
    )
