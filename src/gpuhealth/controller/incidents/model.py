"""The incident record and the book the controller keeps them in.

An :class:`Incident` is one fleet-level decision about *what* is broken: a job whose processes
fault on many nodes (nothing tainted), a GPU that faults under several jobs (blamed), an NVLink
domain whose fabric faults on several nodes (domain taint), a GPU node whose agent never
reported (unwatched), or an escalated node replaced (its NodeClaim or Node deleted). Each is
immutable; the :class:`IncidentBook` replaces it on every update.

Ids are stable: the same kind and key (``job:<ns>/<Kind>/<name>/<xid class>``,
``gpu:<node>/<uuid>``, ``domain:<domain id>``, ``unwatched:<node>``,
``replacement:<episode>``) always name the same incident while it is open, so repeated
detections update one record instead of opening new ones. The book is in memory on every
replica (each derives it from the same reports); it is bounded (closed incidents are kept for
``closed_keep`` entries, newest first) and tells listeners about every change (metrics,
Events, the status page).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from gpuhealth.common.logging import get_logger

log = get_logger("incidents")

IncidentKind = Literal["job", "gpu", "domain", "unwatched", "replacement"]
IncidentState = Literal["open", "closed"]
Change = Literal["opened", "updated", "closed"]
KINDS: tuple[IncidentKind, ...] = ("job", "gpu", "domain", "unwatched", "replacement")


def incident_id(kind: IncidentKind, key: str) -> str:
    """A stable, short id for ``kind`` and its key: ``<kind>-<12 hex>``."""
    digest = hashlib.sha256(f"{kind}\x00{key}".encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


@dataclass(frozen=True, slots=True)
class Subjects:
    """Who an incident is about. ``gpus`` are ``node/uuid`` strings; ``owner`` is the job
    (``namespace/Kind/name``) for job incidents, ``domain`` the NVLink domain id."""

    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    owner: str = ""
    domain: str = ""
    pods: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": list(self.nodes), "gpus": list(self.gpus)}
        if self.owner:
            out["owner"] = self.owner
        if self.domain:
            out["domain"] = self.domain
        if self.pods:
            out["pods"] = list(self.pods)
        return out


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

    @property
    def id(self) -> str:
        return incident_id(self.kind, self.key)

    @property
    def open(self) -> bool:
        return self.state == "open"

    def to_dict(self) -> dict[str, Any]:
        """The API's and the status page's shape."""
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
        return out


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


Listener = Callable[[Change, Incident], None]


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
    ) -> Incident:
        """Open the incident ``kind``/``key`` or update the open one (a closed one with the same
        key is reopened as a new record: ``opened_at`` = ``now``)."""
        iid = incident_id(kind, key)
        prior = self._open.get(iid)
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
        closed = replace(
            prior, state="closed", closed_at=now, reason=reason if reason else prior.reason
        )
        self._closed[iid] = closed
        self._closed.move_to_end(iid)
        while len(self._closed) > self._closed_keep:
            self._closed.popitem(last=False)
        log.info("incident-closed", id=iid, kind=prior.kind, key=prior.key)
        self._notify("closed", closed)
        return closed

    def get(self, iid: str) -> Incident | None:
        return self._open.get(iid) or self._closed.get(iid)

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


def _same(a: Incident, b: Incident) -> bool:
    """Equal apart from ``last_seen``: an update that changes nothing is not an update."""
    return (
        a.subjects == b.subjects
        and a.decision == b.decision
        and a.reason == b.reason
        and dict(a.evidence) == dict(b.evidence)
        and a.xid_class == b.xid_class
    )
