"""The ``GPURemediation`` custom resource (``gpuhealth.io/v1alpha1``, cluster-scoped).

One object per node episode. ``spec`` is what the controller decided when it saw the fault
(the node, its GPUs, the verdict, the action) and never changes (the CRD rejects edits);
``status`` is where the episode stands, written only by the controller through the status
subresource. Operators act through annotations (``<prefix>/approve``, ``<prefix>/abort``,
``<prefix>/release``; docs/remediation.md).

Cluster-scoped because a Node is: one list shows every episode (``kubectl get
gpuremediations``), names derive from the node, and nothing ties an episode to the
namespace gpuhealth happens to run in. The schema is
``deploy/helm/gpuhealth/files/crds/gpuremediations.gpuhealth.io.yaml`` (kept in step with
these structs by tests/unit/test_remediation_crd.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import msgspec

from gpuhealth.controller.names import API_GROUP

GROUP = API_GROUP
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPURemediation"
PLURAL = "gpuremediations"

MAX_LISTED_PODS = 200
"""``evictedPods`` / ``waitingPods`` keep at most this many entries (the counts keep going)."""
MAX_TEXT = 1024
MAX_RELEASE = 253
"""The longest ``<prefix>/release`` value kept as it is in ``status.releaseHandled`` (the
CRD's bound); a longer one is kept as its digest (:func:`handled_release`)."""


class Phase(StrEnum):
    PENDING = "Pending"
    """Recorded; waiting for admission (concurrency cap, breaker, holds, dry-run)."""
    QUARANTINED = "Quarantined"
    DRAINING = "Draining"
    REMEDIATING = "Remediating"
    VALIDATING = "Validating"
    RETURNED = "Returned"
    FAILED = "Failed"
    ESCALATED = "Escalated"


ACTIVE_PHASES = frozenset({Phase.QUARANTINED, Phase.DRAINING, Phase.REMEDIATING, Phase.VALIDATING})
"""Phases that count against the concurrency cap."""
TERMINAL_PHASES = frozenset({Phase.RETURNED, Phase.FAILED, Phase.ESCALATED})

Action = Literal["reset-gpu", "reboot", "escalate"]
Scope = Literal["gpu", "node"]
"""``gpu``: drain only the pods on the failed GPUs (and their gangs); ``node``: every pod."""


class _Wire(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, frozen=True):
    """camelCase on the wire; defaults left out (no nulls for the structural schema)."""


class FaultGpu(_Wire, frozen=True):
    """One failed GPU and the signal that started the episode (its primary condition)."""

    uuid: str
    index: int
    code: str
    reason: str = ""
    action: str = ""
    """The verdict's recommended action (``RESET_GPU``, ``RESTART_BM`` ...)."""
    since: datetime | None = None
    message: str = ""
    scope: str = ""
    """The driver's impact scope of the condition (``StatusCondition.scope``: ``gpu-instance``,
    ``nvlink-domain`` ...); empty: the GPU (not known). It bounds the action
    (:func:`gpuhealth.controller.remediation.fault.scoped_action`)."""


class Fault(_Wire, frozen=True):
    fingerprint: str
    """Hash of node, boot id and every (GPU, code, since): the episode's identity."""
    boot_id: str
    detected_at: datetime
    gpus: list[FaultGpu]
    recommended_action: str = ""
    escalation_reason: str = ""
    """Why the action is ``escalate`` although the verdict recommended another (repeats)."""


class Spec(_Wire, frozen=True):
    node_name: str
    action: Action
    scope: Scope
    fault: Fault
    approval_required: bool = False
    dry_run: bool = False


class PhaseTimes(_Wire, frozen=True):
    """When the episode entered each phase (``drained``, ``remediated``, ``validated``,
    ``returned`` mark the end of a stage; ``returned`` is when the quarantine taint was
    seen gone)."""

    detected: datetime | None = None
    pending: datetime | None = None
    quarantined: datetime | None = None
    draining: datetime | None = None
    drained: datetime | None = None
    remediating: datetime | None = None
    remediated: datetime | None = None
    validating: datetime | None = None
    validated: datetime | None = None
    returned: datetime | None = None
    failed: datetime | None = None
    escalated: datetime | None = None


class PodRecord(_Wire, frozen=True):
    """A pod the drain evicted, or one it waits for (``reason`` says why)."""

    namespace: str
    name: str
    uid: str = ""
    node: str = ""
    gang: str = ""
    reason: str = ""
    """Waiting: ``pdb-blocked``, ``gang-pdb-blocked``, ``let-finish``, ``never``,
    ``terminating``, ``over-cap``, ``error``."""
    message: str = ""
    at: datetime | None = None


class GangKey(_Wire, frozen=True):
    """One label or annotation every member of a gang carries."""

    source: Literal["label", "annotation"]
    key: str
    value: str


class FrozenGang(_Wire, frozen=True):
    """A gang as it was when the drain first evicted it: only these pods (by UID) are ever
    evicted for it; pods its job controller creates later are not members."""

    kind: str
    namespace: str
    match: list[GangKey]
    uids: list[str]
    at: datetime | None = None


class OrderStatus(_Wire, frozen=True):
    """The last order sent to the agent and what it said."""

    id: str
    action: str
    attempt: int = 1
    sent_at: datetime | None = None
    delivered: bool = False
    state: str = ""
    """The report's state (``accepted``, ``running``, ``succeeded``, ``failed``, ``refused``)."""
    reason: str = ""
    message: str = ""
    reported_at: datetime | None = None


class Check(_Wire, frozen=True):
    name: str
    passed: bool
    message: str = ""


class ValidationStatus(_Wire, frozen=True):
    attempt: int = 1
    """1, then one more per operator release."""
    started_at: datetime | None = None
    agent_passed: bool = False
    pod_name: str = ""
    pod_uid: str = ""
    """The UID the create call returned: the only pod of ``pod_name`` the validation accepts
    (name, labels and owner can be forged by anyone who may create pods there)."""
    pod_tries: int = 0
    """Pods created for this attempt beyond the first: a pod of the name whose UID was not
    recorded (a lost status write, or someone else's) is never trusted, a new name is."""
    pod_passed: bool = False
    checks: list[Check] = []


class StatusCondition(_Wire, frozen=True):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


class Status(_Wire, frozen=True):
    phase: Phase
    reason: str = ""
    """CamelCase: why the episode is where it is (the last transition, or what it waits for)."""
    message: str = ""
    times: PhaseTimes = msgspec.field(default_factory=PhaseTimes)
    attempts: int = 0
    """Attempts of the current action (reset retries)."""
    last_error: str = ""
    boot_id_before: str = ""
    """The node's boot id when the action started (a reboot is done when it changes)."""
    approved_by: str = ""
    release_handled: str = ""
    """The ``<prefix>/release`` value already acted on, as :func:`handled_release` stores it
    (a new value releases again)."""
    drain_attempt_at: datetime | None = None
    evicted_pods: list[PodRecord] = []
    evicted_count: int = 0
    waiting_pods: list[PodRecord] = []
    waiting_count: int = 0
    frozen_gangs: list[FrozenGang] = []
    """The gangs this episode evicted, with their members when first evicted."""
    touched_nodes: list[str] = []
    """Other nodes whose pods this episode evicted (gang members), each charged to the
    circuit breaker; at most ``drain.max_other_nodes``."""
    order: OrderStatus | None = None
    validation: ValidationStatus | None = None
    conditions: list[StatusCondition] = []


class Episode(msgspec.Struct, frozen=True, kw_only=True):
    """A GPURemediation as read from the API server (the metadata the loop needs)."""

    name: str
    spec: Spec
    status: Status
    uid: str = ""
    resource_version: str = ""
    created: datetime | None = None
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    annotations: Mapping[str, str] = msgspec.field(default_factory=dict)

    @property
    def node(self) -> str:
        return self.spec.node_name

    @property
    def phase(self) -> Phase:
        return self.status.phase

    @property
    def terminal(self) -> bool:
        return self.status.phase in TERMINAL_PHASES


class InvalidEpisode(ValueError):
    """An object that is not a valid GPURemediation (hand-written, or another version)."""


def initial_status(detected_at: datetime) -> Status:
    return Status(phase=Phase.PENDING, times=PhaseTimes(detected=detected_at, pending=detected_at))


def episode_from_api(obj: Mapping[str, Any]) -> Episode:
    meta = obj.get("metadata") or {}
    try:
        spec = msgspec.convert(obj.get("spec") or {}, Spec)
        raw_status = obj.get("status") or {}
        status = (
            msgspec.convert(raw_status, Status)
            if raw_status.get("phase")
            else initial_status(spec.fault.detected_at)
        )
        created = meta.get("creationTimestamp")
        return Episode(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            created=msgspec.convert(created, datetime) if created else None,
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            spec=spec,
            status=status,
        )
    except msgspec.ValidationError as exc:
        raise InvalidEpisode(f"GPURemediation {meta.get('name', '?')}: {exc}") from exc


def episode_body(name: str, spec: Spec, labels: Mapping[str, str]) -> dict[str, Any]:
    """The object to create (status is set by a separate write to the status subresource)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": msgspec.to_builtins(spec),
    }


def status_body(episode: Episode, status: Status) -> dict[str, Any]:
    """A full-object body for ``PUT .../status``, guarded by the resourceVersion."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": episode.name, "resourceVersion": episode.resource_version},
        "spec": msgspec.to_builtins(episode.spec),
        "status": msgspec.to_builtins(status),
    }


def replace_status(ep: Episode, status: Status) -> Episode:
    return msgspec.structs.replace(ep, status=status)


def handled_release(value: str) -> str:
    """How an operator's ``<prefix>/release`` value is stored once acted on, and compared with
    the annotation: the value itself up to :data:`MAX_RELEASE` characters, else
    ``sha256:<hex>`` of it. Stored cut and compared whole, a long value looked new on every
    pass: Escalated -> Validating -> Escalated without end."""
    if len(value) <= MAX_RELEASE:
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def released_again(annotations: Mapping[str, str], key: str, st: Status) -> str:
    """The release annotation's value when it asks for a release not yet acted on, else ""."""
    value = annotations.get(key, "")
    return value if value and handled_release(value) != st.release_handled else ""


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
