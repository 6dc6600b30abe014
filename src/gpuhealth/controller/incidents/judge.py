"""The job-or-GPU judge at work: between the agents' stream and the fleet, it charges each
application-class XID to the job on its GPU at that moment, decides (:func:`.blame.judge`),
and keeps the incident book, the Events and the GPUs' blame up to date.

It is the stream server's :class:`~gpuhealth.controller.stream.session.IngestSink` and passes
every message on to the fleet, after :func:`.overlay.overlay`: the agent's ``xid-repeated``
is the judge's to decide (dropped), and a blamed GPU carries ``gpu-blamed`` (unhealthy,
RUN_DIAGNOSTICS), so the policy, the remediation loop, placement and the status page all see
the controller's verdict. A GPU blamed or cleared between two messages of its agent is
written to the fleet at once as a transition of that GPU.

Network blame (:mod:`.network_blame`): the Snapshots' NIC ports feed the rails' fault spells;
a report a faulting rail behind its GPU explains does not count towards the GPU's blame, and a
job incident names the rails of its nodes that faulted under its crash.

Allocations come from the agents' Snapshots (PodResources); a pod is looked up (its job) when
it appears on a GPU, so a crashed pod deleted before its XID arrives is still known. A node
whose agent says its allocations are unknown (``Snapshot.allocations_unknown``) has its
reports charged to :data:`~.blame.UNKNOWN_JOB` (never "no job": they blame no GPU and make no
job incident) and its agent's ``xid-repeated`` stands as sent (the agent's per-GPU rule). Every
replica judges (each sees the reports its agents send, the leader all of them once agents
reconnect); only Events are writes, and only the leader writes them. Time is the controller's
monotonic clock; an XID replayed from an agent's outbox keeps its age.

A new leader adopts the blames from their GPUIncidents before its first reconcile
(:meth:`IncidentJudge.adopt`: since, until, the condition's message and XID), so the GPU is
blamed again the moment its agent reconnects, and until then its node, without data, keeps its
taint. An operator's resolve (:meth:`IncidentJudge.resolve`) lifts a blame or closes a job
incident, and the reports of that GPU or job from before the resolution stop counting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import msgspec

from gpuhealth.common.clock import Clock, sleep_or_wake
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.fleet.model import Fleet, shared_copy
from gpuhealth.controller.incidents.blame import (
    UNKNOWN_JOB,
    GpuFinding,
    JobAttempt,
    JobFinding,
    Judgement,
    XidOccurrence,
    by_job,
    gpu_reason,
    job_reason,
    judge,
)
from gpuhealth.controller.incidents.forwarder import HandoffForwarder
from gpuhealth.controller.incidents.job_home import JobHome
from gpuhealth.controller.incidents.jobs import JobKubeEvents, JobRef, PodJobs
from gpuhealth.controller.incidents.lifecycle import OnCallAction, resolution
from gpuhealth.controller.incidents.model import (
    BlameDecision,
    Incident,
    IncidentBook,
    Subjects,
    incident_id,
)
from gpuhealth.controller.incidents.network_blame import (
    RailHistory,
    RailSpell,
    job_rails,
    rail_note,
    unexplained,
)
from gpuhealth.controller.incidents.overlay import (
    BLAME_CODE,
    SUSPECT_CODE,
    blame_condition,
    overlay,
)
from gpuhealth.controller.incidents.settings import JudgeSettings
from gpuhealth.controller.remediation.model import Episode
from gpuhealth.protocol import Condition, Event, GpuStatus, Heartbeat, Hello, Snapshot
from gpuhealth.protocol.v1 import HealthState

log = get_logger("incidents")

BLAME_DECISION = "gpu blamed: unhealthy + diagnostic"
SUSPECT_DECISION = "gpu suspected: degraded (soft taint)"
MAX_WARM = 10000
"""Pods waiting for their job lookup (beyond it, new pods are looked up when they fault), and
jobs remembered for their Events."""


@dataclass(slots=True)
class _Pending:
    node: str
    gpu: str
    xid: int
    xid_class: str
    at: float
    pods: tuple[str, ...]
    detail: str = ""
    unknown: bool = False
    """The node's allocations were unknown when it arrived."""


@dataclass(slots=True)
class _Blame:
    since: datetime
    until: float
    """Monotonic."""
    until_wall: datetime
    """The same moment by the wall clock (what a successor reads), set when ``until`` moves."""
    condition: Condition

    @property
    def suspected(self) -> bool:
        return self.condition.code == SUSPECT_CODE

    def decision(self) -> BlameDecision:
        return BlameDecision(
            self.since,
            self.until_wall,
            self.condition.message,
            self.condition.xid,
            suspected=self.suspected,
        )


class _AgentView(msgspec.Struct, gc=False):
    """A GPU's verdict as its agent sent it (one per GPU in the fleet: not tracked by the
    garbage collector, it refers to nothing that refers back)."""

    index: int
    state: HealthState
    conditions: list[Condition]


@dataclass(slots=True)
class JudgeStats:
    """What the judge counted (the metrics collector reads it)."""

    reports: dict[str, int] = field(default_factory=dict)
    """Judged reports by XID class."""
    last_delay_s: dict[str, float] = field(default_factory=dict)
    """Seconds from the last report to the decision, by incident kind (the latest opened)."""
    events_written: int = 0
    rail_explained: int = 0
    """Reports in the windows a faulting rail explains (network blame), at the last decision."""
    rails_faulting: int = 0
    """Ports whose link verdict holds, at the last decision."""


class IncidentJudge:
    def __init__(
        self,
        settings: JudgeSettings,
        book: IncidentBook,
        fleet: Fleet,
        *,
        clock: Clock,
        jobs: PodJobs,
        events: JobKubeEvents | None = None,
        may_write: Callable[[], bool] = lambda: False,
        episodes: Callable[[], list[Episode]] | None = None,
    ) -> None:
        """``episodes``: the GPURemediation cache; a blamed GPU the loop reset is no longer
        blamed (its validation, with the diagnostic, decides; its old reports are dropped)."""
        self.s = settings
        self._episodes = episodes
        self.book = book
        self.fleet = fleet
        self._clock = clock
        self._jobs = jobs
        self._events = events
        self._may_write = may_write
        self.stats = JudgeStats()
        self._reports: deque[XidOccurrence] = deque()
        self._pending: list[_Pending] = []
        self._warm: dict[tuple[str, str], None] = {}
        self._refs: dict[str, JobRef] = {}
        self._on_gpu: dict[str, dict[str, tuple[str, ...]]] = {}
        self._left: dict[tuple[str, str], tuple[tuple[str, ...], float]] = {}
        self._unknown: dict[str, str] = {}
        """Node -> why its agent cannot say which pods hold its GPUs (its last Snapshot)."""
        self._parent: dict[str, dict[str, str]] = {}
        self._agent: dict[tuple[str, str], _AgentView] = {}
        self._blames: dict[tuple[str, str], _Blame] = {}
        self._resolved: dict[str, float] = {}
        """Incident id (a GPU's or a job's) -> monotonic time an operator resolved it: its
        reports from before do not count."""
        self._last_arrival = 0.0
        self._wake = asyncio.Event()
        self.rails = RailHistory(
            merge_s=settings.rail_grace_s,
            horizon_s=max(settings.job_window_s, settings.gpu_window_s) + settings.rail_grace_s,
        )
        """The rails' fault spells from the Snapshots (network blame)."""
        self.home: JobHome | None = None
        """Past one process: which jobs this replica decides, which nodes it owns
        (:mod:`.job_home`); None with one shard: every job and node."""
        self.forwarder: HandoffForwarder | None = None
        """Past one process: where reports of jobs homed elsewhere, and attempts first faulting
        on other owners' nodes, go."""
        self._remote: dict[tuple[str, int], tuple[JobAttempt, ...]] = {}
        """(job, shard) -> the attempts another owner (the job's home) found whose first fault
        is on nodes of that shard (owned here)."""

    # -- read side ----------------------------------------------------------------------------

    def blamed(self) -> dict[tuple[str, str], Condition]:
        """(node, GPU UUID) -> the blame condition, for every blamed GPU."""
        return {k: b.condition for k, b in self._blames.items()}

    def allocations_unknown(self) -> dict[str, str]:
        """Node -> why its allocations are unknown (its GPUs are not blamed from application
        faults meanwhile)."""
        return dict(self._unknown)

    # -- IngestSink ---------------------------------------------------------------------------

    def on_connect(self, node: str, hello: Hello) -> None:
        self.fleet.on_connect(node, hello)

    def on_disconnect(self, node: str) -> None:
        self.rails.disconnected(node)
        self.fleet.on_disconnect(node)

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        if not self.s.enabled:
            self.fleet.on_message(node, msg)
            return
        if isinstance(msg, Snapshot):
            msg = self._snapshot(node, msg)
        elif isinstance(msg, Event):
            msg = self._event(node, msg)
        self.fleet.on_message(node, msg)

    def _snapshot(self, node: str, snap: Snapshot) -> Snapshot:
        if snap.allocations_unknown is None:
            self._unknown.pop(node, None)
        else:
            self._unknown[node] = snap.allocations_unknown
        parents: dict[str, str] = {}
        for st in snap.gpus:
            for mig in st.info.mig_devices:
                parents[mig.uuid] = st.info.uuid
        self._parent[node] = parents
        on_gpu: dict[str, list[str]] = {}
        for a in snap.allocations:
            gpu = parents.get(a.gpu_uuid, a.gpu_uuid)
            pod = f"{a.namespace}/{a.pod}"
            if pod not in on_gpu.setdefault(gpu, []):
                on_gpu[gpu].append(pod)
        now = self._clock.monotonic()
        before = self._on_gpu.get(node, {})
        after = {gpu: tuple(sorted(pods)) for gpu, pods in on_gpu.items()}
        for gpu, pods in before.items():
            if after.get(gpu) != pods:
                self._left[(node, gpu)] = (pods, now)
        for pods in after.values():
            for p in pods:
                if not any(p in old for old in before.values()) and len(self._warm) < MAX_WARM:
                    ns, _, name = p.partition("/")
                    self._warm[(ns, name)] = None
        self._on_gpu[node] = after
        self.rails.observe(node, snap.nics, now, self._clock.now())
        if self._warm:
            self._wake.set()
        gpus = [self._status(node, st) for st in snap.gpus]
        return msgspec.structs.replace(snap, gpus=gpus)

    def _status(self, node: str, st: GpuStatus) -> GpuStatus:
        key = (node, st.info.uuid)
        self._agent[key] = _AgentView(st.info.index, st.state, shared_copy(st.conditions))
        state, conditions = self._overlay(key, st.state, st.conditions)
        if state == st.state and conditions == st.conditions:
            return st
        return msgspec.structs.replace(st, state=state, conditions=conditions)

    def _overlay(
        self, key: tuple[str, str], state: HealthState, conditions: list[Condition]
    ) -> tuple[HealthState, list[Condition]]:
        blame = self._blames.get(key)
        return overlay(
            state,
            conditions,
            demote_agent_escalation=self.s.judge_agent_escalation and key[0] not in self._unknown,
            blame=blame.condition if blame is not None else None,
        )

    def _event(self, node: str, ev: Event) -> Event:
        gpu = self._parent.get(node, {}).get(ev.gpu_uuid, ev.gpu_uuid)
        cls = self.s.class_of(ev.xid) if ev.xid is not None else None
        if ev.xid is not None and cls is not None:
            now = self._clock.monotonic()
            horizon = max(self.s.job_window_s, self.s.gpu_window_s)
            age = min(horizon, max(0.0, (self._clock.now() - ev.at).total_seconds()))
            at = now - age
            unknown = node in self._unknown
            pods = () if unknown else self._pods_at(node, gpu, at)
            self._pending.append(_Pending(node, gpu, ev.xid, cls, at, pods, ev.detail, unknown))
            self._last_arrival = now
            self._wake.set()
        if ev.kind != "transition":
            return ev
        key = (node, ev.gpu_uuid)
        self._agent[key] = _AgentView(ev.gpu_index, ev.current, shared_copy(ev.conditions))
        state, conditions = self._overlay(key, ev.current, ev.conditions)
        if state == ev.current and conditions == ev.conditions:
            return ev
        return msgspec.structs.replace(ev, current=state, conditions=conditions)

    def _pods_at(self, node: str, gpu: str, at: float) -> tuple[str, ...]:
        """The pods on the GPU at ``at``: those on it now, else the last ones to leave it within
        ``allocation_linger_s`` of ``at``."""
        now_on = self._on_gpu.get(node, {}).get(gpu, ())
        if now_on:
            return now_on
        left = self._left.get((node, gpu))
        if left is not None and left[1] >= at - self.s.allocation_linger_s:
            return left[0]
        return ()

    # -- the decision loop --------------------------------------------------------------------

    async def run(self) -> None:
        """The named task ``incident-judge``: resolve, decide, write; on every report and every
        ``tick_s``."""
        while True:
            await self.step()
            await sleep_or_wake(self._clock, self.s.tick_s, self._wake)

    async def step(self) -> None:
        """Look up new pods' jobs, charge the pending reports, decide, apply."""
        self._wake.clear()
        warm, self._warm = list(self._warm), {}
        for ns, pod in warm:
            await self._job_of(f"{ns}/{pod}")
        pending, self._pending = self._pending, []
        for p in pending:
            jobs = sorted({(await self._job_of(pod)).key for pod in p.pods})
            job = UNKNOWN_JOB if p.unknown else "+".join(jobs) if jobs else None
            self._reports.append(
                XidOccurrence(
                    at=p.at,
                    node=p.node,
                    gpu=p.gpu,
                    xid=p.xid,
                    xid_class=p.xid_class,
                    job=job,
                    pod=p.pods[0] if p.pods else "",
                    detail=p.detail,
                )
            )
            self.stats.reports[p.xid_class] = self.stats.reports.get(p.xid_class, 0) + 1
            self._hand_over(self._reports[-1])
        await self.decide()

    def _hand_over(self, r: XidOccurrence) -> None:
        """Past one process, a report of a job homed in a shard another replica owns goes
        there too (it stays here for its GPU's own rules)."""
        if self.home is None or self.forwarder is None:
            return
        home = self.home.away(r.job)
        if home is not None:
            self.forwarder.report(r, home)

    # -- other owners (past one process) ------------------------------------------------------

    def receive_reports(self, reports: Sequence[XidOccurrence]) -> None:
        """Reports of jobs homed here, from their nodes' owners: they count for the jobs'
        incidents and attempts (never for a GPU of a node this replica does not own)."""
        if not self.s.enabled:
            return
        self._reports.extend(reports)
        self._last_arrival = self._clock.monotonic()
        self._wake.set()

    def receive_attempts(self, job: str, shard: int, attempts: Sequence[JobAttempt]) -> None:
        """``job``'s home owner's attempts first faulting on nodes of ``shard`` (all of them:
        they replace the ones it sent before)."""
        if not self.s.enabled:
            return
        if attempts:
            self._remote[(job, shard)] = tuple(attempts)
        else:
            self._remote.pop((job, shard), None)
        self._wake.set()

    def _remote_attempts(self, since: float) -> list[JobAttempt]:
        """The other owners' attempts still in the window (the older ones forgotten)."""
        self._remote = {
            k: live
            for k, ats in self._remote.items()
            if (live := tuple(a for a in ats if a.last_at >= since))
        }
        return [a for ats in self._remote.values() for a in ats]

    def _judge(self, reports: list[XidOccurrence], now: float) -> Judgement:
        """:func:`.blame.judge`, past one process within this replica's jobs and nodes."""
        if self.home is None:
            return judge(reports, now, self.s)
        return judge(
            reports,
            now,
            self.s,
            decides=self.home.decides,
            owns=self.home.serves,
            remote=self._remote_attempts(now - self.s.gpu_window_s),
        )

    async def _job_of(self, pod: str) -> JobRef:
        ns, _, name = pod.partition("/")
        ref = await self._jobs.job(ns, name) or JobRef(ns, "Pod", name)
        if len(self._refs) >= MAX_WARM and ref.key not in self._refs:
            self._refs.clear()  # bounded: only the Events of incidents opened later need them
        self._refs[ref.key] = ref
        return ref

    async def decide(self) -> None:
        now = self._clock.monotonic()
        wall = self._clock.now()
        horizon = now - max(self.s.job_window_s, self.s.gpu_window_s)
        while self._reports and (
            self._reports[0].at < horizon or len(self._reports) > self.s.max_reports
        ):
            self._reports.popleft()
        self._resolved = {k: t for k, t in self._resolved.items() if t >= horizon}
        counted = sorted((r for r in self._reports if self._counts(r)), key=lambda r: r.at)
        spells = self.rails.spells(now)
        verdict = self._network_blame(self._judge(counted, now), counted, spells, now)
        if self.forwarder is not None:
            self.forwarder.attempts(verdict.foreign)
        opened = [
            jf
            for jf in by_job(verdict.jobs)
            if self._job_incident(jf, now, wall, job_rails(jf, spells, self.s.rail_grace_s))
        ]
        for inc in self.book.list(kind="job"):
            if self.home is not None and not self.home.decides(inc.key):
                self.book.hand_over(inc.id)  # its home shard moved: its new owner decides
            elif (wall - inc.last_seen).total_seconds() >= self.s.incident_close_s:
                self.book.close(inc.id, wall, reason="no new report since")
        for gf in verdict.gpus:
            self._blame(gf, now, wall)
        reset = self._reset_by_remediation()
        for key, b in list(self._blames.items()):
            if key in reset and reset[key] >= b.since:
                self._reports = deque(
                    r for r in self._reports if (r.node, r.gpu) != key or r.at > now
                )
                self._unblame(
                    key,
                    wall,
                    why="reset by the remediation loop; its validation runs the diagnostic",
                )
            elif b.until <= now:
                self._unblame(key, wall, why="no fault for the hold period")
        for jf in opened:  # every decision first: the Events are writes, and take time
            await self._job_events(jf, wall)

    def _network_blame(
        self,
        verdict: Judgement,
        counted: list[XidOccurrence],
        spells: list[RailSpell],
        now: float,
    ) -> Judgement:
        """The GPUs blamed without the reports a faulting rail behind them explains
        (:mod:`gpuhealth.controller.incidents.network_blame`); the job incidents as found."""
        kept = unexplained(counted, spells, self.s.rail_grace_s)
        self.stats.rail_explained = len(counted) - len(kept)
        self.stats.rails_faulting = self.rails.faulting()
        if len(kept) == len(counted):
            return verdict
        return Judgement(
            jobs=verdict.jobs, gpus=self._judge(kept, now).gpus, foreign=verdict.foreign
        )

    def _counts(self, r: XidOccurrence) -> bool:
        """Not older than an operator's resolution of its GPU's or its job's incident."""
        if not self._resolved:
            return True
        keys = [incident_id("gpu", f"{r.node}/{r.gpu}")]
        keys += [incident_id("job", job) for job in (r.job or "").split("+") if job]
        return all(r.at > self._resolved.get(k, float("-inf")) for k in keys)

    # -- a new leader, an operator ---------------------------------------------------------

    def adopt(self, incidents: Sequence[Incident]) -> None:
        """Take the stored blames over (a new leader, before its first reconcile): the same
        condition, since and until; and the resolution times of resolved GPU and job
        incidents. Blames this replica made itself and no object holds stay."""
        now = self._clock.monotonic()
        wall = self._clock.now()
        for i in incidents:
            seen = i.observed.resolved
            if i.kind in ("gpu", "job") and seen is not None and seen.applied:
                self._resolved[i.id] = now - (wall - seen.seen_at).total_seconds()
            if i.kind != "gpu" or not i.open or i.blame is None:
                continue
            node, _, gpu = i.key.partition("/")
            b = i.blame
            self._blames[(node, gpu)] = _Blame(
                since=b.since,
                until=now + (b.until - wall).total_seconds(),
                until_wall=b.until,
                condition=blame_condition(b.message, b.since, b.xid, suspected=b.suspected),
            )
            self._apply((node, gpu))
        self._wake.set()

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        """An operator resolved a GPU's blame (lifted: the GPU's own verdict again) or a job's
        incident (closed); their reports from before stop counting."""
        self._resolved[incident.id] = self._clock.monotonic()
        wall = self._clock.now()
        if incident.kind == "gpu":
            node, _, gpu = incident.key.partition("/")
            if (node, gpu) in self._blames:
                self._unblame((node, gpu), wall, why=resolution(action))
                return
        self.book.close(incident.id, wall, reason=resolution(action))

    def _reset_by_remediation(self) -> dict[tuple[str, str], datetime]:
        """(node, GPU) -> when a remediation episode for its blame finished its action."""
        out: dict[tuple[str, str], datetime] = {}
        if self._episodes is None or not self._blames:
            return out
        for ep in self._episodes():
            done = ep.status.times.remediated
            if done is None:
                continue
            for g in ep.spec.fault.gpus:
                if g.code == BLAME_CODE:
                    out[(ep.spec.node_name, g.uuid)] = done
        return out

    def _job_incident(
        self, f: JobFinding, now: float, wall: datetime, rails: tuple[str, ...] = ()
    ) -> bool:
        """Open or update the job's incident (naming the ``rails`` that faulted under it);
        True when it is new."""
        new = self.book.find("job", f.job) is None
        evidence = {"nodes": len(f.nodes), "gpus": len(f.gpus), "reports": f.reports}
        if rails:
            evidence["rails"] = len(rails)
        incident = self.book.open(
            "job",
            f.job,
            subjects=Subjects(nodes=f.nodes, gpus=f.gpus, owner=f.job, pods=f.pods, rails=rails),
            decision="no taint",
            reason=job_reason(f, self.s) + rail_note(rails),
            now=wall,
            evidence=evidence,
            xid_class=f.xid_class,
        )
        if new:
            self.stats.last_delay_s["job"] = max(0.0, now - self._last_arrival)
            log.warning(
                "job-incident",
                id=incident.id,
                job=f.job,
                nodes=len(f.nodes),
                xids=f.xids,
                rails=list(rails),
            )
        return new

    async def _job_events(self, f: JobFinding, wall: datetime) -> None:
        """The Warning Event on the job's owner and its pods (leader only)."""
        ref = self._refs.get(f.job)
        if ref is None or self._events is None or not self.s.events or not self._may_write():
            return
        await self._events.job_incident(ref, f.pods, job_reason(f, self.s), wall)
        self.stats.events_written += 1

    def _blame(self, f: GpuFinding, now: float, wall: datetime) -> None:
        key = (f.node, f.gpu)
        reason = gpu_reason(f, self.s)
        until = f.last_at + self.s.blame_hold_s
        prior = self._blames.get(key)
        until_wall = wall + timedelta(seconds=until - now)
        if prior is None or (prior.suspected and not f.suspected):
            # New, or a suspected GPU now blamed (never back: a blame holds until it expires).
            xid = f.xids[-1] if f.xids else None
            cond = blame_condition(reason, wall, xid, suspected=f.suspected)
            prior = _Blame(since=wall, until=until, until_wall=until_wall, condition=cond)
            self._blames[key] = prior
            self.stats.last_delay_s["gpu"] = max(0.0, now - self._last_arrival)
            log.warning(
                "gpu-suspected" if f.suspected else "gpu-blamed",
                node=f.node,
                gpu=f.gpu,
                jobs=f.jobs,
                first_in=f.first_in,
            )
            self._apply(key)
        elif until > prior.until:
            prior.until, prior.until_wall = until, until_wall
        evidence = {"jobs": len(f.jobs), "no_job_bursts": f.no_job_bursts, "reports": f.reports}
        if f.first_in is not None:
            evidence["first_fault_attempts"] = f.first_in[1]
        self.book.open(
            "gpu",
            f"{f.node}/{f.gpu}",
            subjects=Subjects(nodes=(f.node,), gpus=(f"{f.node}/{f.gpu}",)),
            decision=SUSPECT_DECISION if prior.suspected else BLAME_DECISION,
            reason=reason if prior.suspected == f.suspected else prior.condition.message,
            now=wall,
            evidence=evidence,
            xid_class=",".join(sorted(self.s.gpu_blame_classes)),
            blame=prior.decision(),
        )

    def _unblame(self, key: tuple[str, str], wall: datetime, *, why: str) -> None:
        self._blames.pop(key, None)
        log.info("gpu-blame-lifted", node=key[0], gpu=key[1], why=why)
        inc = self.book.find("gpu", f"{key[0]}/{key[1]}")
        if inc is not None:
            self.book.close(inc.id, wall, reason=why)
        self._apply(key)

    def _apply(self, key: tuple[str, str]) -> None:
        """Write the GPU's overlaid verdict to the fleet now (its agent's next message would
        too); a node not reporting keeps it for its next message."""
        node, gpu = key
        view = self._agent.get(key)
        rec = self.fleet.node(node)
        if view is None or rec is None or not rec.connected or rec.silent:
            return
        record = rec.gpus.get(gpu)
        state, conditions = self._overlay(key, view.state, view.conditions)
        self.fleet.on_message(
            node,
            Event(
                seq=1,
                node=node,
                at=self._clock.now(),
                kind="transition",
                gpu_uuid=gpu,
                gpu_index=view.index,
                previous=record.state if record is not None else view.state,
                current=state,
                conditions=conditions,
            ),
        )
