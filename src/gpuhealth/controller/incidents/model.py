"""The incident record and the book the controller keeps them in.

An :class:`Incident` is one fleet-level decision about *what* is broken: a job whose processes
fault on many nodes (nothing tainted), a GPU that faults under several jobs (blamed), an NVLink
domain whose fabric faults on several nodes (domain taint), a GPU node whose agent never
reported (unwatched), a taint of ours someone removed by hand (override: not put back),
agents that cannot carry out what the remediation loop needs (capability: one incident for
every such node, no RMA label on any), or an escalated node replaced (replacement: its
NodeClaim or Node deleted). Each is immutable; the :class:`IncidentBook` replaces it on every
update.

Ids are stable: the same kind and key (``job:<ns>/<Kind>/<name>/<xid class>``,
``gpu:<node>/<uuid>``, ``domain:<domain id>``, ``unwatched:<node>``,
``override:<node>/<key>=<value>:<effect>``, ``capability:no-executor``,
``replacement:<episode>``) always name the same incident, so repeated detections update one
record instead of opening new ones; the id is also the name of its ``GPUIncident`` object
(:mod:`gpuhealth.controller.incidents.resource`). The book is the deciders' memory: the judge,
the domain monitor, the unwatched watch, the overrides and the replacements write it; on the
leader every change reaches the API server and on-call's lifecycle edits come back
(:mod:`gpuhealth.controller.incidents.mirror`), and a new leader restores it from the objects
before its first reconcile (:mod:`gpuhealth.controller.incidents.adoption`).
Besides what is shown, an incident carries what a successor needs to take its decision over
exactly (:class:`DomainDecision`, :class:`BlameDecision`, :class:`OverrideDecision`). The book
is bounded (closed incidents are kept for ``closed_keep`` entries, newest first) and tells
listeners about every change (metrics, Events, the status page, the mirror).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.lifecycle import (
    ACTION_NAMES,
    Lifecycle,
    ObservedLifecycle,
    Paging,
    on_open,
    paging,
)
from gpuhealth.controller.taints.policy import Taint

log = get_logger("incidents")

IncidentKind = Literal["job", "gpu", "domain", "unwatched", "override", "capability", "replacement"]
IncidentState = Literal["open", "closed"]
Change = Literal["opened", "updated", "closed"]
KINDS: tuple[IncidentKind, ...] = (
    "job",
    "gpu",
    "domain",
    "unwatched",
    "override",
    "capability",
    "replacement",
)


def incident_id(kind: IncidentKind, key: str) -> str:
    """A stable, short id for ``kind`` and its key: ``<kind>-<12 hex>``."""
    digest = hashlib.sha256(f"{kind}\x00{key}".encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


@dataclass(frozen=True, slots=True)
class Subjects:
    """Who an incident is about. ``gpus`` are ``node/uuid`` strings; ``owner`` is the job
    (``namespace/Kind/name``) for job incidents, ``domain`` the NVLink domain id, ``rails``
    the network ports a job incident puts its crash on."""

    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    owner: str = ""
    domain: str = ""
    pods: tuple[str, ...] = ()
    rails: tuple[str, ...] = ()
    """``node/device/port`` of the network ports that went down or flapped under a job's crash
    (:mod:`gpuhealth.controller.incidents.network_blame`)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": list(self.nodes), "gpus": list(self.gpus)}
        if self.owner:
            out["owner"] = self.owner
        if self.domain:
            out["domain"] = self.domain
        if self.pods:
            out["pods"] = list(self.pods)
        if self.rails:
            out["rails"] = list(self.rails)
        return out


@dataclass(frozen=True, slots=True)
class DomainDecision:
    """A domain incident's decision, for a successor: the domain's nodes, those that faulted
    while it was open (each must report a healthy fabric again before it closes), and whether
    the breaker admitted the domain whole (its taint is written) or holds it; ``held``: nodes
    that joined the admitted domain later and that the breaker holds (not tainted)."""

    members: tuple[str, ...]
    faulted: tuple[str, ...]
    admitted: bool
    held: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BlameDecision:
    """A GPU blame, for a successor: since when, until when it holds without a new fault, and
    the ``gpu-blamed`` condition's message and XID (the GPU's verdict is rebuilt exactly);
    ``suspected``: only suspected (``gpu-suspected``, the soft taint)."""

    since: datetime
    until: datetime
    message: str
    xid: int | None = None
    suspected: bool = False


@dataclass(frozen=True, slots=True)
class OverrideDecision:
    """A taint of ours removed by hand while the verdict wanted it: not put back while this
    incident is open. ``by``: the field manager that last changed the node's taints (best
    effort: ``kubectl-taint``, ``kubectl-edit`` ...)."""

    taint: Taint
    by: str = ""


@dataclass(frozen=True, slots=True)
class Incident:
    """One fleet-level decision.

    ``decision`` is what was done, in a few words ("no taint", "gpu blamed: unhealthy +
    diagnostic", "domain taint", "reported"); ``reason`` a human sentence saying why;
    ``evidence`` the counts behind it (e.g. ``{"nodes": 16, "reports": 16, "jobs": 1}``).
    """

    kind: IncidentKind
    key: str
    subjects: Subjects
    decision: str
    reason: str
    opened_at: datetime
    last_seen: datetime
    evidence: Mapping[str, int] = field(default_factory=dict)
    state: IncidentState = "open"
    closed_at: datetime | None = None
    xid_class: str = ""
    close_reason: str = ""
    domain: DomainDecision | None = None
    blame: BlameDecision | None = None
    override: OverrideDecision | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    """On-call's actions (the object's ``spec.lifecycle``)."""
    observed: ObservedLifecycle = field(default_factory=ObservedLifecycle)
    """What the controller made of them (``status.observedLifecycle``)."""

    @property
    def id(self) -> str:
        return incident_id(self.kind, self.key)

    @property
    def open(self) -> bool:
        return self.state == "open"

    def paging(self, now: datetime) -> Paging:
        """Whether the open incident's alert pages (on-call acknowledged or silenced it)."""
        return paging(self.lifecycle, self.observed, now)

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        """The API's and the status page's shape (``now``: to say whether it pages)."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "subjects": self.subjects.to_dict(),
            "decision": self.decision,
            "reason": self.reason,
            "evidence": dict(self.evidence),
            "openedAt": _iso(self.opened_at),
            "lastSeen": _iso(self.last_seen),
        }
        if self.xid_class:
            out["xidClass"] = self.xid_class
        if self.closed_at is not None:
            out["closedAt"] = _iso(self.closed_at)
        if self.close_reason:
            out["closeReason"] = self.close_reason
        lifecycle: dict[str, Any] = {}
        for name in ACTION_NAMES:
            act = self.lifecycle.action(name)
            if act is None:
                continue
            item: dict[str, Any] = {"by": act.by, "at": _iso(act.at), "reason": act.reason}
            if act.until is not None:
                item["until"] = _iso(act.until)
            seen = self.observed.seen(name)
            item["applied"] = seen is not None and seen.at == act.at and seen.applied
            lifecycle[name] = item
        if lifecycle:
            out["lifecycle"] = lifecycle
        if self.open and now is not None:
            out["paging"] = self.paging(now)
        return out


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


Listener = Callable[[Change, Incident], None]


class IncidentReader(Protocol):
    """What the API, the status page and the metrics read: the book on the leader, the
    objects its watch brings on a replica that does not lead
    (:class:`gpuhealth.controller.incidents.mirror.IncidentsShown`)."""

    def list(
        self, *, kind: IncidentKind | None = None, include_closed: bool = False
    ) -> list[Incident]: ...

    def counts(self) -> dict[IncidentKind, int]: ...

    def get(self, iid: str) -> Incident | None: ...


class IncidentBook:
    """The controller's incidents, in memory. Not thread-safe: used from the event loop.

    :meth:`open` opens or updates (same kind and key → same incident, ``opened_at`` kept);
    :meth:`close` closes; listeners hear ``opened``/``updated``/``closed`` synchronously
    (a listener's error is logged, never raised into the caller).
    """

    def __init__(self, *, closed_keep: int = 200) -> None:
        self._open: dict[str, Incident] = {}
        self._closed: OrderedDict[str, Incident] = OrderedDict()
        self._closed_keep = closed_keep
        self._listeners: list[Listener] = []
        self.opened_total: dict[IncidentKind, int] = dict.fromkeys(KINDS, 0)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def open(
        self,
        kind: IncidentKind,
        key: str,
        *,
        subjects: Subjects,
        decision: str,
        reason: str,
        now: datetime,
        evidence: Mapping[str, int] | None = None,
        xid_class: str = "",
        domain: DomainDecision | None = None,
        blame: BlameDecision | None = None,
        override: OverrideDecision | None = None,
    ) -> Incident:
        """Open the incident ``kind``/``key`` or update the open one (a closed one with the same
        key is reopened as a new record: ``opened_at`` = ``now``, on-call's earlier actions
        belong to the previous occurrence)."""
        iid = incident_id(kind, key)
        prior = self._open.get(iid)
        if prior is not None:
            lifecycle, observed = prior.lifecycle, prior.observed
        else:
            earlier = self._closed.get(iid)
            lifecycle = earlier.lifecycle if earlier is not None else Lifecycle()
            observed = on_open(lifecycle, now)
        incident = Incident(
            kind=kind,
            key=key,
            subjects=subjects,
            decision=decision,
            reason=reason,
            opened_at=prior.opened_at if prior is not None else now,
            last_seen=now,
            evidence=dict(evidence or {}),
            xid_class=xid_class,
            domain=domain,
            blame=blame,
            override=override,
            lifecycle=lifecycle,
            observed=observed,
        )
        if prior is not None and _same(prior, incident):
            return self.touch(iid, now) or incident
        self._open[iid] = incident
        self._closed.pop(iid, None)
        if prior is None:
            self.opened_total[kind] += 1
            log.info("incident-opened", id=iid, kind=kind, key=key, decision=decision)
        self._notify("updated" if prior is not None else "opened", incident)
        return incident

    def touch(self, iid: str, now: datetime) -> Incident | None:
        """Move an open incident's ``last_seen`` to ``now`` without telling listeners."""
        prior = self._open.get(iid)
        if prior is None:
            return None
        updated = replace(prior, last_seen=now)
        self._open[iid] = updated
        return updated

    def close(self, iid: str, now: datetime, *, reason: str | None = None) -> Incident | None:
        prior = self._open.pop(iid, None)
        if prior is None:
            return None
        closed = replace(prior, state="closed", closed_at=now, close_reason=reason or "")
        self._closed[iid] = closed
        self._closed.move_to_end(iid)
        while len(self._closed) > self._closed_keep:
            self._closed.popitem(last=False)
        log.info("incident-closed", id=iid, kind=prior.kind, key=prior.key)
        self._notify("closed", closed)
        return closed

    def get(self, iid: str) -> Incident | None:
        return self._open.get(iid) or self._closed.get(iid)

    def set_lifecycle(
        self, iid: str, lifecycle: Lifecycle, observed: ObservedLifecycle
    ) -> Incident | None:
        """On-call's actions as the object has them now, and what was made of them (listeners
        hear ``updated`` when either changed)."""
        prior = self.get(iid)
        if prior is None or (prior.lifecycle == lifecycle and prior.observed == observed):
            return prior
        updated = replace(prior, lifecycle=lifecycle, observed=observed)
        if prior.open:
            self._open[iid] = updated
        else:
            self._closed[iid] = updated
        self._notify("updated", updated)
        return updated

    def restore(self, incidents: list[Incident]) -> None:
        """Replace the book with ``incidents`` (a new leader's adoption of the stored ones;
        listeners hear nothing: nothing was decided). Closed ones are kept newest last, as
        :meth:`close` keeps them."""
        self._open = {i.id: i for i in incidents if i.open}
        closed = sorted((i for i in incidents if not i.open), key=_closed_order)
        self._closed = OrderedDict((i.id, i) for i in closed[-self._closed_keep :])

    def forget(self, iid: str) -> None:
        """Drop a closed incident (its object was deleted after the retention)."""
        self._closed.pop(iid, None)

    def hand_over(self, iid: str) -> None:
        """Drop an open incident another replica decides now (past one process: a job whose
        home shard this replica no longer owns): nothing is written, its object is the
        decider's."""
        self._open.pop(iid, None)

    def ids(self) -> list[str]:
        """Every incident's id, open and closed."""
        return [*self._open, *self._closed]

    def find(self, kind: IncidentKind, key: str) -> Incident | None:
        """The open incident for ``kind``/``key``, if any."""
        return self._open.get(incident_id(kind, key))

    def list(
        self, *, kind: IncidentKind | None = None, include_closed: bool = False
    ) -> list[Incident]:
        """Open incidents (then, if asked, closed ones newest first), newest ``last_seen``
        first within each group."""
        opened = sorted(self._open.values(), key=lambda i: (i.last_seen, i.id), reverse=True)
        out = [i for i in opened if kind is None or i.kind == kind]
        if include_closed:
            out.extend(i for i in reversed(self._closed.values()) if kind is None or i.kind == kind)
        return out

    def counts(self) -> dict[IncidentKind, int]:
        """Open incidents per kind (every kind present, zero included)."""
        out: dict[IncidentKind, int] = dict.fromkeys(KINDS, 0)
        for i in self._open.values():
            out[i.kind] += 1
        return out

    def __len__(self) -> int:
        return len(self._open)

    def _notify(self, change: Change, incident: Incident) -> None:
        for listener in self._listeners:
            try:
                listener(change, incident)
            except Exception:  # a listener never breaks the decision
                log.exception("incident-listener-failed", id=incident.id, change=change)


def _closed_order(i: Incident) -> tuple[datetime, str]:
    return (i.closed_at or i.last_seen, i.id)


def _same(a: Incident, b: Incident) -> bool:
    """Equal apart from ``last_seen``: an update that changes nothing is not an update."""
    return (
        a.subjects == b.subjects
        and a.decision == b.decision
        and a.reason == b.reason
        and dict(a.evidence) == dict(b.evidence)
        and a.xid_class == b.xid_class
        and a.domain == b.domain
        and a.blame == b.blame
        and a.override == b.override
    )
