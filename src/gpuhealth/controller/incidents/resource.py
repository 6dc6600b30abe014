"""The ``GPUIncident`` custom resource (``gpuhealth.io/v1alpha1``, cluster-scoped) and the
incident it holds (pure).

One object per incident, named by its id (``domain-<12 hex>`` ...). The split follows who
decides:

- ``status`` is the controller's decision, written only through the status subresource
  (only the controller's ServiceAccount may): kind, key, subjects, decision, reason,
  evidence, state, the times, and what a successor needs to take the decision over exactly
  (``domain``, ``blame``, ``override``), with ``observedLifecycle`` (what the controller made
  of on-call's actions);
- ``spec`` is on-call's: only ``spec.lifecycle`` (``acknowledged``, ``silenced`` with
  ``until``, ``resolved``, each ``{by, at, reason}``). The controller creates the object with
  an empty spec and never writes it again; the chart's admission policy makes ``by`` the
  requesting user.

Labels ``<prefix>/incident-kind`` and ``<prefix>/incident-state`` are for selectors. Lists
are bounded as the schema bounds them (``deploy/helm/gpuhealth/files/crds/
gpuincidents.gpuhealth.io.yaml``, held to these structs by
tests/unit/controller/incidents/test_resource.py): what does not fit is cut here, the
counts in ``evidence`` keep going.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec

from gpuhealth.controller.incidents.lifecycle import (
    ActionName,
    Lifecycle,
    ObservedLifecycle,
    OnCallAction,
    Seen,
)
from gpuhealth.controller.incidents.model import (
    KINDS,
    BlameDecision,
    DomainDecision,
    Incident,
    IncidentKind,
    OverrideDecision,
    Subjects,
)
from gpuhealth.controller.names import API_GROUP, Keys
from gpuhealth.controller.taints.policy import Taint

GROUP = API_GROUP
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUIncident"
PLURAL = "gpuincidents"

MAX_NODES = 1000
"""``subjects.nodes`` and a domain's ``members``/``faulted`` (an NVLink domain has at most a
few hundred trays; a job's nodes beyond it are counted in ``evidence``)."""
MAX_GPUS = 1000
MAX_PODS = 200
MAX_TEXT = 1024
MAX_KEY = 1024
MAX_NAME = 253
MAX_EVIDENCE = 16


class _IncidentWire(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, frozen=True):
    """camelCase on the wire; defaults left out (no nulls for the structural schema)."""


class WireAction(_IncidentWire, frozen=True):
    by: str
    at: datetime
    reason: str


class WireSilence(_IncidentWire, frozen=True):
    by: str
    at: datetime
    reason: str
    until: datetime


class WireLifecycle(_IncidentWire, frozen=True):
    acknowledged: WireAction | None = None
    silenced: WireSilence | None = None
    resolved: WireAction | None = None


class IncidentSpec(_IncidentWire, frozen=True):
    """On-call's part."""

    lifecycle: WireLifecycle | None = None


class WireSubjects(_IncidentWire, frozen=True):
    nodes: list[str] = msgspec.field(default_factory=list)
    gpus: list[str] = msgspec.field(default_factory=list)
    owner: str = ""
    domain: str = ""
    pods: list[str] = msgspec.field(default_factory=list)


class WireDomain(_IncidentWire, frozen=True):
    members: list[str]
    faulted: list[str] = msgspec.field(default_factory=list)
    admitted: bool = False


class WireBlame(_IncidentWire, frozen=True):
    since: datetime
    until: datetime
    message: str
    xid: int | None = None


class WireTaint(_IncidentWire, frozen=True):
    key: str
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    value: str = ""


class WireOverride(_IncidentWire, frozen=True):
    taint: WireTaint
    by: str = ""


class WireSeen(_IncidentWire, frozen=True):
    at: datetime
    applied: bool
    seen_at: datetime


class WireObserved(_IncidentWire, frozen=True):
    acknowledged: WireSeen | None = None
    silenced: WireSeen | None = None
    resolved: WireSeen | None = None


class IncidentStatus(_IncidentWire, frozen=True):
    """The controller's part."""

    kind: IncidentKind
    key: str
    state: Literal["open", "closed"]
    subjects: WireSubjects
    decision: str
    reason: str
    opened_at: datetime
    last_seen: datetime
    node_count: int = 0
    """Nodes the incident is about (the printer column; ``subjects.nodes`` may be cut)."""
    evidence: dict[str, int] = msgspec.field(default_factory=dict)
    xid_class: str = ""
    closed_at: datetime | None = None
    close_reason: str = ""
    domain: WireDomain | None = None
    blame: WireBlame | None = None
    override: WireOverride | None = None
    observed_lifecycle: WireObserved | None = None


class InvalidIncident(ValueError):
    """An object that is not a valid GPUIncident (hand-written past the schema, another
    version)."""


@dataclass(frozen=True, slots=True)
class StoredIncident:
    """One GPUIncident as the API server has it."""

    name: str
    resource_version: str
    labels: Mapping[str, str]
    lifecycle: Lifecycle
    status: IncidentStatus | None
    """None until the controller wrote it (the object was just created)."""

    def incident(self) -> Incident | None:
        """The incident the object holds (None while its status is not written)."""
        return None if self.status is None else incident_of(self.status, self.lifecycle)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- incident -> object ---------------------------------------------------------------------


def _action_wire(a: OnCallAction | None) -> WireAction | WireSilence | None:
    if a is None:
        return None
    if a.until is not None:
        return WireSilence(by=a.by, at=a.at, reason=a.reason, until=a.until)
    return WireAction(by=a.by, at=a.at, reason=a.reason)


def _seen_wire(s: Seen | None) -> WireSeen | None:
    return None if s is None else WireSeen(at=s.at, applied=s.applied, seen_at=s.seen_at)


def lifecycle_wire(lc: Lifecycle) -> WireLifecycle:
    silenced = lc.silenced
    return WireLifecycle(
        acknowledged=_plain(lc.acknowledged),
        silenced=None
        if silenced is None or silenced.until is None
        else WireSilence(
            by=silenced.by, at=silenced.at, reason=silenced.reason, until=silenced.until
        ),
        resolved=_plain(lc.resolved),
    )


def _plain(a: OnCallAction | None) -> WireAction | None:
    return None if a is None else WireAction(by=a.by, at=a.at, reason=a.reason)


def status_of(i: Incident) -> IncidentStatus:
    """The incident as the object's status (lists cut to the schema's bounds)."""
    s = i.subjects
    observed = WireObserved(
        acknowledged=_seen_wire(i.observed.acknowledged),
        silenced=_seen_wire(i.observed.silenced),
        resolved=_seen_wire(i.observed.resolved),
    )
    return IncidentStatus(
        kind=i.kind,
        key=i.key,
        state=i.state,
        subjects=WireSubjects(
            nodes=list(s.nodes[:MAX_NODES]),
            gpus=list(s.gpus[:MAX_GPUS]),
            owner=clip(s.owner, MAX_KEY),
            domain=s.domain,
            pods=list(s.pods[:MAX_PODS]),
        ),
        decision=clip(i.decision, 256),
        reason=clip(i.reason),
        opened_at=i.opened_at,
        last_seen=i.last_seen,
        node_count=len(s.nodes),
        evidence=dict(list(i.evidence.items())[:MAX_EVIDENCE]),
        xid_class=i.xid_class,
        closed_at=i.closed_at,
        close_reason=clip(i.close_reason),
        domain=None
        if i.domain is None
        else WireDomain(
            members=list(i.domain.members[:MAX_NODES]),
            faulted=list(i.domain.faulted[:MAX_NODES]),
            admitted=i.domain.admitted,
        ),
        blame=None
        if i.blame is None
        else WireBlame(
            since=i.blame.since,
            until=i.blame.until,
            message=clip(i.blame.message),
            xid=i.blame.xid,
        ),
        override=None
        if i.override is None
        else WireOverride(
            taint=WireTaint(
                key=i.override.taint.key,
                value=i.override.taint.value,
                effect=i.override.taint.effect,  # type: ignore[arg-type]
            ),
            by=clip(i.override.by, MAX_NAME),
        ),
        observed_lifecycle=observed if observed != WireObserved() else None,
    )


def labels_of(i: Incident, keys: Keys) -> dict[str, str]:
    return {keys.incident_kind_label: i.kind, keys.incident_state_label: i.state}


def new_object(i: Incident, keys: Keys) -> dict[str, Any]:
    """The object to create: its name and labels, an empty spec (on-call's); the status is
    written next, through the status subresource."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": i.id, "labels": labels_of(i, keys)},
        "spec": {},
    }


def status_object(name: str, resource_version: str, status: IncidentStatus) -> dict[str, Any]:
    """A body for ``PUT .../status``, guarded by the resourceVersion (the spec it would carry
    is not written through the status subresource, so none is sent)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "resourceVersion": resource_version},
        "status": msgspec.to_builtins(status),
    }


def lifecycle_patch(name: ActionName, action: OnCallAction) -> dict[str, Any]:
    """A merge patch of ``spec.lifecycle`` setting one action (on-call's command)."""
    wire = _action_wire(action)
    return {"spec": {"lifecycle": {name: msgspec.to_builtins(wire)}}}


# -- object -> incident ---------------------------------------------------------------------


def _action(w: WireAction | WireSilence | None) -> OnCallAction | None:
    if w is None:
        return None
    until = w.until if isinstance(w, WireSilence) else None
    return OnCallAction(w.by, w.at, w.reason, until)


def _seen(w: WireSeen | None) -> Seen | None:
    return None if w is None else Seen(w.at, w.applied, w.seen_at)


def lifecycle_of(w: WireLifecycle | None) -> Lifecycle:
    if w is None:
        return Lifecycle()
    return Lifecycle(
        acknowledged=_action(w.acknowledged),
        silenced=_action(w.silenced),
        resolved=_action(w.resolved),
    )


def incident_of(st: IncidentStatus, lifecycle: Lifecycle) -> Incident:
    s = st.subjects
    obs = st.observed_lifecycle or WireObserved()
    override = None
    if st.override is not None:
        t = st.override.taint
        override = OverrideDecision(Taint(t.key, t.value, t.effect), st.override.by)
    return Incident(
        kind=st.kind,
        key=st.key,
        subjects=Subjects(
            nodes=tuple(s.nodes),
            gpus=tuple(s.gpus),
            owner=s.owner,
            domain=s.domain,
            pods=tuple(s.pods),
        ),
        decision=st.decision,
        reason=st.reason,
        opened_at=st.opened_at,
        last_seen=st.last_seen,
        evidence=dict(st.evidence),
        state=st.state,
        closed_at=st.closed_at,
        xid_class=st.xid_class,
        close_reason=st.close_reason,
        domain=None
        if st.domain is None
        else DomainDecision(tuple(st.domain.members), tuple(st.domain.faulted), st.domain.admitted),
        blame=None
        if st.blame is None
        else BlameDecision(st.blame.since, st.blame.until, st.blame.message, st.blame.xid),
        override=override,
        lifecycle=lifecycle,
        observed=ObservedLifecycle(
            acknowledged=_seen(obs.acknowledged),
            silenced=_seen(obs.silenced),
            resolved=_seen(obs.resolved),
        ),
    )


def stored_incident(obj: Mapping[str, Any]) -> StoredIncident:
    """Parse a GPUIncident; :class:`InvalidIncident` for anything else."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    try:
        spec = msgspec.convert(obj.get("spec") or {}, IncidentSpec)
        raw = obj.get("status") or {}
        status = msgspec.convert(raw, IncidentStatus) if raw else None
    except msgspec.ValidationError as exc:
        raise InvalidIncident(f"GPUIncident {name or '?'}: {exc}") from exc
    if status is not None and status.kind not in KINDS:
        raise InvalidIncident(f"GPUIncident {name}: unknown kind {status.kind!r}")
    if status is not None and incident_of(status, Lifecycle()).id != name:
        raise InvalidIncident(f"GPUIncident {name}: its name is not the id of its kind and key")
    return StoredIncident(
        name=name,
        resource_version=str(meta.get("resourceVersion", "")),
        labels=dict(meta.get("labels") or {}),
        lifecycle=lifecycle_of(spec.lifecycle),
        status=status,
    )
