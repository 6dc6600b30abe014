"""Past one process, what one shard's owner hands another about jobs, and the routes that take
it (:mod:`.job_home`: a job is decided by its home shard's owner).

- ``POST /api/v1/shards/reports`` (:data:`REPORTS_PATH`): reports charged to jobs homed in a
  shard of the receiver; they count for the jobs' incidents and attempts there.
- ``POST /api/v1/shards/attempts`` (:data:`ATTEMPTS_PATH`): a home owner's attempts of one job
  whose first fault is on nodes of one shard of the receiver (:class:`AttemptSet`, replacing
  the set it sent before for that job and shard); they count towards those GPUs' suspicion
  and blame as the receiver's own.

Times travel as wall-clock time (each replica's monotonic clock is its own) and are converted
to the receiver's monotonic clock on arrival, an age clamped to ``0..horizon`` as an agent's
replayed XID is. The bodies are validated (:mod:`msgspec`: types, lengths, list sizes; the
HTTP server bounds their bytes, ``http.max_body_bytes``); anything else is a 400 with the
reason, counted in ``gpuhealth_shard_handoffs_rejected_total{kind}``, and changes nothing.
Callers are authorized by the HTTP authorizer: ``create shardreports.gpuhealth.io``
(:mod:`gpuhealth.controller.http.access`), which the chart grants the controller's own
ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated, Literal, Protocol, TypeVar

import msgspec
from aiohttp import web
from msgspec import Meta
from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.blame import JobAttempt, XidOccurrence
from gpuhealth.protocol.shards import MAX_SHARDS

log = get_logger("incidents.handoff")

REPORTS_PATH = "/api/v1/shards/reports"
ATTEMPTS_PATH = "/api/v1/shards/attempts"
MAX_ITEMS = 1000
"""Most reports, sets, or attempts in a set, one body holds."""

Kind = Literal["reports", "attempts"]

Name = Annotated[str, Meta(min_length=1, max_length=253)]
Job = Annotated[str, Meta(min_length=1, max_length=2048)]
Text = Annotated[str, Meta(max_length=1024)]
Xid = Annotated[int, Meta(ge=0, le=1 << 20)]
Wall = Annotated[datetime, Meta(tz=True)]


class HandedXid(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One report (:class:`~.blame.XidOccurrence`) charged to a job homed elsewhere."""

    at: Wall
    node: Name
    gpu: Name
    xid: Xid
    xid_class: Annotated[str, Meta(min_length=1, max_length=64)]
    job: Job
    pod: Text = ""
    detail: Text = ""


class XidBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reports: Annotated[list[HandedXid], Meta(max_length=MAX_ITEMS)]


class HandedAttempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One attempt (:class:`~.blame.JobAttempt`) whose first fault is on ``node``/``gpu``."""

    first_at: Wall
    last_at: Wall
    node: Name
    gpu: Name
    xid: Xid
    where: Text = ""


class AttemptSet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every attempt of ``job`` the home owner found whose first fault is on a node of
    ``shard`` (empty: none any more)."""

    job: Job
    shard: Annotated[int, Meta(ge=0, lt=MAX_SHARDS)]
    attempts: Annotated[list[HandedAttempt], Meta(max_length=MAX_ITEMS)]


class AttemptBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sets: Annotated[list[AttemptSet], Meta(max_length=MAX_ITEMS)]


def wall_of(at: float, clock: Clock) -> datetime:
    """A moment of ``clock``'s monotonic time as wall-clock time (what travels)."""
    return clock.now() - timedelta(seconds=clock.monotonic() - at)


def monotonic_of(at: datetime, clock: Clock, horizon_s: float) -> float:
    """A wall-clock moment on ``clock``'s monotonic time, its age clamped to ``0..horizon_s``
    (a sender's clock ahead is now; an older moment is as old as the judge looks back)."""
    age = min(horizon_s, max(0.0, (clock.now() - at).total_seconds()))
    return clock.monotonic() - age


def handed_xid(r: XidOccurrence, job: str, clock: Clock) -> HandedXid:
    """``r`` (charged to ``job``, its ``job``) as it travels."""
    return HandedXid(
        at=wall_of(r.at, clock),
        node=r.node,
        gpu=r.gpu,
        xid=r.xid,
        xid_class=r.xid_class,
        job=job,
        pod=r.pod,
        detail=r.detail[:1024],
    )


def received_xid(h: HandedXid, clock: Clock, horizon_s: float) -> XidOccurrence:
    return XidOccurrence(
        at=monotonic_of(h.at, clock, horizon_s),
        node=h.node,
        gpu=h.gpu,
        xid=h.xid,
        xid_class=h.xid_class,
        job=h.job,
        pod=h.pod,
        detail=h.detail,
    )


def handed_attempt(a: JobAttempt, clock: Clock) -> HandedAttempt:
    return HandedAttempt(
        first_at=wall_of(a.first_at, clock),
        last_at=wall_of(a.last_at, clock),
        node=a.node,
        gpu=a.gpu,
        xid=a.xid,
        where=a.where,
    )


def received_attempt(job: str, h: HandedAttempt, clock: Clock, horizon_s: float) -> JobAttempt:
    return JobAttempt(
        job=job,
        first_at=monotonic_of(h.first_at, clock, horizon_s),
        last_at=monotonic_of(h.last_at, clock, horizon_s),
        node=h.node,
        gpu=h.gpu,
        xid=h.xid,
        where=h.where,
    )


class HandoffMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.sent = Counter(
            "gpuhealth_shard_handoffs",
            "Past one process: job reports and attempt sets handed to other shards' owners, "
            "by kind (reports, attempts) and result (sent; failed: tried again after a "
            "backoff; dropped: the queue was full)",
            ["kind", "result"],
            registry=registry,
        )
        self.rejected = Counter(
            "gpuhealth_shard_handoffs_rejected",
            "Past one process: bodies of another owner's handoff refused as malformed (HTTP "
            "400), by kind (reports, attempts)",
            ["kind"],
            registry=registry,
        )


class Receiver(Protocol):
    """The judge (:class:`~.judge.IncidentJudge`)."""

    def receive_reports(self, reports: Sequence[XidOccurrence]) -> None: ...

    def receive_attempts(self, job: str, shard: int, attempts: Sequence[JobAttempt]) -> None: ...


_Body = TypeVar("_Body", XidBatch, AttemptBatch)


class HandoffRoutes:
    """The receiving side: two routes in front of the judge."""

    def __init__(
        self, judge: Receiver, clock: Clock, metrics: HandoffMetrics, *, horizon_s: float
    ) -> None:
        """``horizon_s``: how far back the judge looks (the longer of its windows)."""
        self._judge = judge
        self._clock = clock
        self.metrics = metrics
        self._horizon_s = horizon_s

    def routes(self) -> list[web.RouteDef]:
        return [web.post(REPORTS_PATH, self.reports), web.post(ATTEMPTS_PATH, self.attempts)]

    async def reports(self, request: web.Request) -> web.Response:
        batch = await self._decode(request, XidBatch, "reports")
        if not isinstance(batch, XidBatch):
            return batch
        self._judge.receive_reports(
            [received_xid(h, self._clock, self._horizon_s) for h in batch.reports]
        )
        return web.json_response({"accepted": len(batch.reports)})

    async def attempts(self, request: web.Request) -> web.Response:
        batch = await self._decode(request, AttemptBatch, "attempts")
        if not isinstance(batch, AttemptBatch):
            return batch
        for s in batch.sets:
            self._judge.receive_attempts(
                s.job,
                s.shard,
                [received_attempt(s.job, h, self._clock, self._horizon_s) for h in s.attempts],
            )
        return web.json_response({"accepted": len(batch.sets)})

    async def _decode(
        self, request: web.Request, kind: type[_Body], name: Kind
    ) -> _Body | web.Response:
        raw = await request.read()
        try:
            return msgspec.json.decode(raw, type=kind)
        except msgspec.DecodeError as exc:  # ValidationError is one
            self.metrics.rejected.labels(name).inc()
            log.warning("shard_handoff_rejected", kind=name, peer=request.remote, error=str(exc))
            return web.json_response({"error": "malformed", "message": str(exc)}, status=400)
