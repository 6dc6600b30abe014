"""The job-or-GPU decision, table-tested with storm shapes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuhealth.controller.incidents.blame import XidOccurrence, gpu_reason, job_reason, judge
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
    Case("one GPU under the same job 5 times", gpu_under(["a"] * 5), [], []),
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
    from gpuhealth.controller.incidents.blame import by_job

    j = judge(job_crash("train", 16) + job_crash("train", 16, xid=43), NOW, S)
    assert [f.key for f in j.jobs] == ["ml/Job/train/app-abort", "ml/Job/train/app-fault"]
    [merged] = by_job(j.jobs)
    assert merged.job == "ml/Job/train" and merged.xid_class == "app-abort,app-fault"
    assert len(merged.nodes) == 16 and merged.reports == 768 and merged.xids == (13, 43)
