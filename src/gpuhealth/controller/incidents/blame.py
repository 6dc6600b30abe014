"""Job or GPU: the fleet-level decision over application-class XIDs (pure).

Each report is one application-class XID (:class:`~.settings.JudgeSettings` ``xid_classes``)
on one GPU, charged to the job that ran on the GPU at that moment (``job`` None: no pod held
it). :func:`judge` looks at the reports in their windows and finds

- **job incidents**: the same XID class on GPUs of at least ``job_min_nodes`` nodes running
  one job within ``job_window_s``: the job crashed; no GPU is blamed, nothing is tainted;
- **blamed GPUs**: one GPU faulting (a ``gpu_blame_classes`` class) under at least
  ``gpu_min_jobs`` different jobs within ``gpu_window_s`` (each burst with no job on the GPU
  counts as one more): the GPU, not the applications.

The two are independent: a bad GPU that also sat in a crashed job is blamed, and the crash is
still the job's incident. Reports of one GPU closer together than ``burst_s`` are one burst
(one crash logs an XID per SM).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpuhealth.controller.incidents.settings import JudgeSettings


@dataclass(frozen=True, slots=True)
class XidOccurrence:
    at: float
    """Monotonic seconds (the controller's clock) when the XID happened."""
    node: str
    gpu: str
    """The GPU's UUID."""
    xid: int
    xid_class: str
    job: str | None = None
    """The job (``namespace/Kind/name``) on the GPU then; None: no pod held the GPU."""
    pod: str = ""
    """``namespace/name`` of the pod on the GPU then."""


@dataclass(frozen=True, slots=True)
class JobFinding:
    job: str
    xid_class: str
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]
    """``node/uuid``."""
    pods: tuple[str, ...]
    xids: tuple[int, ...]
    reports: int
    first_at: float
    last_at: float

    @property
    def key(self) -> str:
        return f"{self.job}/{self.xid_class}"


@dataclass(frozen=True, slots=True)
class GpuFinding:
    node: str
    gpu: str
    jobs: tuple[str, ...]
    """The different jobs it faulted under (sorted)."""
    no_job_bursts: int
    xids: tuple[int, ...]
    reports: int
    first_at: float
    last_at: float

    @property
    def contexts(self) -> int:
        return len(self.jobs) + self.no_job_bursts

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu}"


@dataclass(frozen=True, slots=True)
class Judgement:
    jobs: tuple[JobFinding, ...] = ()
    gpus: tuple[GpuFinding, ...] = ()


def judge(reports: Iterable[XidOccurrence], now: float, s: JudgeSettings) -> Judgement:
    """The job incidents and blamed GPUs ``reports`` show at ``now``."""
    job_since = now - s.job_window_s
    gpu_since = now - s.gpu_window_s
    by_job: dict[tuple[str, str], list[XidOccurrence]] = defaultdict(list)
    by_gpu: dict[tuple[str, str], list[XidOccurrence]] = defaultdict(list)
    blame_classes = set(s.gpu_blame_classes)
    for r in reports:
        if r.at > now:
            continue
        if r.job is not None and r.at >= job_since:
            by_job[(r.job, r.xid_class)].append(r)
        if r.xid_class in blame_classes and r.at >= gpu_since:
            by_gpu[(r.node, r.gpu)].append(r)
    jobs = [_job_finding(job, cls, rs) for (job, cls), rs in by_job.items()]
    gpus = [_gpu_finding(node, gpu, rs, s.burst_s) for (node, gpu), rs in by_gpu.items()]
    return Judgement(
        jobs=tuple(
            sorted((j for j in jobs if len(j.nodes) >= s.job_min_nodes), key=lambda j: j.key)
        ),
        gpus=tuple(sorted((g for g in gpus if g.contexts >= s.gpu_min_jobs), key=lambda g: g.key)),
    )


def _job_finding(job: str, xid_class: str, rs: list[XidOccurrence]) -> JobFinding:
    return JobFinding(
        job=job,
        xid_class=xid_class,
        nodes=tuple(sorted({r.node for r in rs})),
        gpus=tuple(sorted({f"{r.node}/{r.gpu}" for r in rs})),
        pods=tuple(sorted({r.pod for r in rs if r.pod})),
        xids=tuple(sorted({r.xid for r in rs})),
        reports=len(rs),
        first_at=min(r.at for r in rs),
        last_at=max(r.at for r in rs),
    )


def _gpu_finding(node: str, gpu: str, rs: list[XidOccurrence], burst_s: float) -> GpuFinding:
    rs = sorted(rs, key=lambda r: r.at)
    no_job_bursts = 0
    last_no_job: float | None = None
    for r in rs:
        if r.job is not None:
            continue
        if last_no_job is None or r.at - last_no_job > burst_s:
            no_job_bursts += 1
        last_no_job = r.at
    return GpuFinding(
        node=node,
        gpu=gpu,
        jobs=tuple(sorted({r.job for r in rs if r.job is not None})),
        no_job_bursts=no_job_bursts,
        xids=tuple(sorted({r.xid for r in rs})),
        reports=len(rs),
        first_at=rs[0].at,
        last_at=rs[-1].at,
    )


def by_job(findings: Iterable[JobFinding]) -> list[JobFinding]:
    """One finding per job: a crash logs several classes (13 where it faulted, 43 where the
    processes were stopped), and it is one incident of that job (``xid_class`` joins them)."""
    grouped: dict[str, list[JobFinding]] = defaultdict(list)
    for f in findings:
        grouped[f.job].append(f)
    out = []
    for job, fs in sorted(grouped.items()):
        out.append(
            JobFinding(
                job=job,
                xid_class=",".join(sorted({f.xid_class for f in fs})),
                nodes=tuple(sorted({n for f in fs for n in f.nodes})),
                gpus=tuple(sorted({g for f in fs for g in f.gpus})),
                pods=tuple(sorted({p for f in fs for p in f.pods})),
                xids=tuple(sorted({x for f in fs for x in f.xids})),
                reports=sum(f.reports for f in fs),
                first_at=min(f.first_at for f in fs),
                last_at=max(f.last_at for f in fs),
            )
        )
    return out


def job_reason(f: JobFinding, s: JudgeSettings) -> str:
    xids = ", ".join(str(x) for x in f.xids)
    return (
        f"XID {xids} ({f.xid_class}) on {len(f.gpus)} GPU(s) of {len(f.nodes)} nodes, all "
        f"running {f.job}, within {s.job_window_s:.0f} s: the job's fault, no GPU blamed, "
        "nothing tainted"
    )


def gpu_reason(f: GpuFinding, s: JudgeSettings) -> str:
    xids = ", ".join(str(x) for x in f.xids)
    under = ", ".join(f.jobs) or "no job"
    extra = f" and {f.no_job_bursts} time(s) with no job" if f.no_job_bursts and f.jobs else ""
    return (
        f"XID {xids} on GPU {f.gpu} of {f.node} under {f.contexts} different jobs ({under}{extra}) "
        f"within {s.gpu_window_s:.0f} s: the GPU, not the applications"
    )
