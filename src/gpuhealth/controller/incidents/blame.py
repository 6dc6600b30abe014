"""Job or GPU: the fleet-level decision over application-class XIDs (pure).

Each report is one application-class XID (:class:`~.settings.JudgeSettings` ``xid_classes``)
on one GPU, charged to the job that ran on the GPU at that moment (``job`` None: no pod held
it). :func:`judge` looks at the reports in their windows and finds

- **job incidents**: the same XID class on GPUs of at least ``job_min_nodes`` nodes running
  one job within ``job_window_s``: the job crashed; no GPU is blamed, nothing is tainted (the
  incident has every class the job logged in the window);
- **blamed GPUs**: one GPU faulting (a ``gpu_blame_classes`` class) under at least
  ``gpu_min_jobs`` different jobs within ``gpu_window_s`` (each burst with no job on the GPU
  counts as one more): the GPU, not the applications;
- **the same GPU first, attempt after attempt**: a restarting job keeps its key, so the GPU
  under it never reaches ``gpu_min_jobs``. Its reports fall into *attempts* (gaps longer than
  ``attempt_gap_s`` between them); the attempt's first fault is its earliest blame-class
  report when no other GPU's follows within ``first_fault_margin_s`` (a crash that faults
  every rank at once names no GPU). The GPU first in ``suspect_attempts`` attempts of one job
  is suspected (soft), in ``blame_attempts`` blamed (hard).

The two are independent: a bad GPU that also sat in a crashed job is blamed, and the crash is
still the job's incident. Reports of one GPU closer together than ``burst_s`` are one burst
(one crash logs an XID per SM).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

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
    detail: str = ""
    """The driver's text of the XID line (XID 13 names the GPC, TPC and SM), where sent."""


UNKNOWN_JOB = "?"
"""The job of a report from a node whose allocations are unknown (its agent cannot read
PodResources): neither "no job" nor any job; it never blames a GPU nor makes a job incident."""


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One attempt of a job (its reports with no gap longer than ``attempt_gap_s``) and where
    its first fault happened (``gpu`` empty: none, or too close to another GPU's to tell)."""

    job: str
    first_at: float
    last_at: float
    node: str = ""
    gpu: str = ""
    xid: int = 0
    where: str = ""
    """XID 13's ``GPC n, TPC n, SM n`` where the line has it."""

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu}" if self.gpu else ""


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
    attempts: tuple[JobAttempt, ...] = ()
    """The job's attempts within ``gpu_window_s``, oldest first (set by :func:`judge`)."""

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
    first_in: tuple[str, int] | None = None
    """(job, attempts): the job whose attempts this GPU was first to fault in most often."""
    suspected: bool = False
    """Only suspected (soft): first in ``suspect_attempts`` attempts of one job, not yet in
    ``blame_attempts`` nor under ``gpu_min_jobs`` jobs."""

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
    foreign: tuple[JobAttempt, ...] = ()
    """Past one process: attempts of the jobs decided here whose first fault is on a node
    another replica owns (its owner counts them: :mod:`.job_home`)."""


def _everything(_key: str) -> bool:
    return True


def judge(
    reports: Iterable[XidOccurrence],
    now: float,
    s: JudgeSettings,
    *,
    decides: Callable[[str], bool] = _everything,
    owns: Callable[[str], bool] = _everything,
    remote: Iterable[JobAttempt] = (),
) -> Judgement:
    """The job incidents and blamed (or suspected) GPUs ``reports`` show at ``now``.

    Past one process (:mod:`.job_home`): only the jobs this replica ``decides`` have incidents
    and attempts; only the GPUs of nodes it ``owns`` are blamed; ``remote``: attempts other
    replicas found whose first fault is on a node owned here, counted as its own."""
    job_since = now - s.job_window_s
    gpu_since = now - s.gpu_window_s
    by_job: dict[tuple[str, str], list[XidOccurrence]] = defaultdict(list)
    by_gpu: dict[tuple[str, str], list[XidOccurrence]] = defaultdict(list)
    of_job: dict[str, list[XidOccurrence]] = defaultdict(list)
    blame_classes = set(s.gpu_blame_classes)
    for r in reports:
        if r.at > now or r.job == UNKNOWN_JOB:
            continue
        if r.job is not None and r.at >= job_since and decides(r.job):
            by_job[(r.job, r.xid_class)].append(r)
        if r.job is not None and r.at >= gpu_since and decides(r.job):
            of_job[r.job].append(r)
        if r.xid_class in blame_classes and r.at >= gpu_since and owns(r.node):
            by_gpu[(r.node, r.gpu)].append(r)
    attempts = {job: job_attempts(job, rs, s) for job, rs in of_job.items()}
    firsts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    foreign: list[JobAttempt] = []
    for job, ats in attempts.items():
        for a in ats:
            if a.gpu and owns(a.node):
                firsts[(a.node, a.gpu)][job] += 1
            elif a.gpu:
                foreign.append(a)
    for a in remote:
        if a.gpu and owns(a.node) and gpu_since <= a.last_at <= now:
            firsts[(a.node, a.gpu)][a.job] += 1
    jobs = [
        replace(_job_finding(job, cls, rs), attempts=attempts.get(job, ()))
        for (job, cls), rs in by_job.items()
    ]
    gpus = [
        g
        for (node, gpu), rs in by_gpu.items()
        if (g := _gpu_verdict(_gpu_finding(node, gpu, rs, s.burst_s), firsts.get((node, gpu)), s))
    ]
    # A job with one class on enough nodes has its incident, with every class it logged (the
    # XID 31 on the one GPU that faulted first, beside the XID 43 of every rank it stopped).
    crashed = {j.job for j in jobs if len(j.nodes) >= s.job_min_nodes}
    return Judgement(
        jobs=tuple(sorted((j for j in jobs if j.job in crashed), key=lambda j: j.key)),
        gpus=tuple(sorted(gpus, key=lambda g: g.key)),
        foreign=tuple(sorted(foreign, key=lambda a: (a.job, a.first_at))),
    )


def job_attempts(job: str, rs: Iterable[XidOccurrence], s: JudgeSettings) -> tuple[JobAttempt, ...]:
    """``job``'s attempts in ``rs`` (its reports), oldest first, each with its first fault."""
    blame_classes = set(s.gpu_blame_classes)
    out: list[JobAttempt] = []
    group: list[XidOccurrence] = []
    for r in sorted(rs, key=lambda r: r.at):
        if group and r.at - group[-1].at > s.attempt_gap_s:
            out.append(_attempt(job, group, blame_classes, s.first_fault_margin_s))
            group = []
        group.append(r)
    if group:
        out.append(_attempt(job, group, blame_classes, s.first_fault_margin_s))
    return tuple(out)


def _attempt(
    job: str, group: list[XidOccurrence], blame_classes: set[str], margin_s: float
) -> JobAttempt:
    base = JobAttempt(job=job, first_at=group[0].at, last_at=group[-1].at)
    faults = [r for r in group if r.xid_class in blame_classes]
    if not faults:
        return base
    first = faults[0]
    if any(
        (f.node, f.gpu) != (first.node, first.gpu) and f.at - first.at <= margin_s
        for f in faults[1:]
    ):
        return base  # several GPUs faulted at once: the crash names none
    return replace(
        base, node=first.node, gpu=first.gpu, xid=first.xid, where=sm_location(first.detail)
    )


_SM = re.compile(r"GPC\s*(\d+)\s*,\s*TPC\s*(\d+)\s*,\s*SM\s*(\d+)")


def sm_location(detail: str) -> str:
    """``GPC n, TPC n, SM n`` from an XID 13 line's text ("" when it has none)."""
    m = _SM.search(detail)
    return f"GPC {m[1]}, TPC {m[2]}, SM {m[3]}" if m else ""


def _gpu_verdict(f: GpuFinding, firsts: Counter[str] | None, s: JudgeSettings) -> GpuFinding | None:
    """Blamed (hard), suspected (soft), or nothing."""
    first_in = None
    if firsts:
        job, n = max(firsts.items(), key=lambda kv: (kv[1], kv[0]))
        first_in = (job, n)
    repeated = first_in[1] if first_in is not None else 0
    if f.contexts >= s.gpu_min_jobs or repeated >= s.blame_attempts:
        return replace(f, first_in=first_in)
    if repeated >= s.suspect_attempts:
        return replace(f, first_in=first_in, suspected=True)
    return None


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
                attempts=fs[0].attempts,
            )
        )
    return out


MAX_NAMED_ATTEMPTS = 8
"""Attempts a job incident's reason names (the latest)."""


def job_reason(f: JobFinding, s: JudgeSettings) -> str:
    xids = ", ".join(str(x) for x in f.xids)
    out = (
        f"XID {xids} ({f.xid_class}) on {len(f.gpus)} GPU(s) of {len(f.nodes)} nodes, all "
        f"running {f.job}, within {s.job_window_s:.0f} s: the job's fault, no GPU blamed, "
        "nothing tainted"
    )
    if f.attempts:
        out += f"; first fault by attempt ({len(f.attempts)}): " + "; ".join(
            f"#{n} {_first_fault(a)}"
            for n, a in enumerate(f.attempts, 1)
            if n > len(f.attempts) - MAX_NAMED_ATTEMPTS
        )
    return out


def _first_fault(a: JobAttempt) -> str:
    if not a.gpu:
        return "no single GPU"
    where = f" ({a.where})" if a.where else ""
    return f"{a.key} XID {a.xid}{where}"


def gpu_reason(f: GpuFinding, s: JudgeSettings) -> str:
    xids = ", ".join(str(x) for x in f.xids)
    first = ""
    if f.first_in is not None and f.first_in[1] >= s.suspect_attempts:
        job, n = f.first_in
        first = f"the first to fault in {n} attempts of {job}"
    if f.contexts < s.gpu_min_jobs and first:
        verdict = "suspected" if f.suspected else "the GPU, not the application"
        return (
            f"XID {xids} on GPU {f.gpu} of {f.node}: {first} within {s.gpu_window_s:.0f} s: "
            f"{verdict}"
        )
    under = ", ".join(f.jobs) or "no job"
    extra = f" and {f.no_job_bursts} time(s) with no job" if f.no_job_bursts and f.jobs else ""
    also = f"; {first}" if first else ""
    return (
        f"XID {xids} on GPU {f.gpu} of {f.node} under {f.contexts} different jobs ({under}{extra}) "
        f"within {s.gpu_window_s:.0f} s{also}: the GPU, not the applications"
    )
