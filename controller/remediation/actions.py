"""What a step of the state machine asks the runner to do, and the status helpers it uses.

Actions are values; the runner carries them out (through the ports) after the circuit
breaker gate allowed the disruptive ones (:func:`hard_write`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

from gpuhealth.controller.breaker.gate import HardWrite
from gpuhealth.controller.remediation.drain import Eviction
from gpuhealth.controller.remediation.facts import PodFacts
from gpuhealth.controller.remediation.model import (
    Condition,
    Episode,
    Phase,
    PhaseTimes,
    Status,
    clip,
)

OrderKind = Literal["reset-gpu", "reboot", "validate", "cancel"]
WriteKind = Literal["quarantine", "evict", "force-delete", "reset-gpu", "reboot"]


@dataclass(frozen=True, slots=True)
class OrderRequest:
    """An order for the node's agent; the sender adds ``seq`` and ``issued_at``."""

    kind: OrderKind
    order_id: str
    deadline_s: float
    gpus: tuple[str, ...] = ()
    expected_boot_id: str = ""
    signals: tuple[str, ...] = ()
    soak_s: float = 0.0
    diagnostic: bool = False
    cancel_order_id: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Quarantine:
    node: str


@dataclass(frozen=True, slots=True)
class Evict:
    eviction: Eviction


@dataclass(frozen=True, slots=True)
class ForceDelete:
    pod: PodFacts


@dataclass(frozen=True, slots=True)
class SendOrder:
    request: OrderRequest


@dataclass(frozen=True, slots=True)
class CreateValidationPod:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class SetNodeLabel:
    node: str
    key: str
    value: str | None


Act = Quarantine | Evict | ForceDelete | SendOrder | CreateValidationPod | SetNodeLabel


@dataclass(frozen=True, slots=True)
class Note:
    """An Event to post about the episode (and, with ``node``, about its Node too)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    node: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    status: Status
    actions: tuple[Act, ...] = ()
    notes: tuple[Note, ...] = ()
    requeue_after_s: float | None = None
    transitions: tuple[tuple[Phase, Phase], ...] = field(default=())


def hard_write(act: Act) -> WriteKind | None:
    """The kind of disruptive write an action is (None: not disruptive)."""
    if isinstance(act, Quarantine):
        return "quarantine"
    if isinstance(act, Evict):
        return "evict"
    if isinstance(act, ForceDelete):
        return "force-delete"
    if isinstance(act, SendOrder) and act.request.kind in ("reset-gpu", "reboot"):
        return act.request.kind
    return None


def _landing(act: Act, node: str) -> str:
    if isinstance(act, Evict):
        return act.eviction.pod.node or node
    if isinstance(act, ForceDelete):
        return act.pod.node or node
    return node


def hard_writes(ep: Episode, actions: Sequence[Act]) -> list[HardWrite]:
    """One gate request per (kind, node) the step's disruptive actions land on: the
    episode's node first, then the other nodes (gang members) by name."""
    count: dict[tuple[WriteKind, str], int] = {}
    for act in actions:
        kind = hard_write(act)
        if kind is not None:
            key = (kind, _landing(act, ep.node))
            count[key] = count.get(key, 0) + 1
    keys = sorted(count, key=lambda k: (k[1] != ep.node, k[1], k[0]))
    return [
        HardWrite(node=node, kind=kind, episode=ep.name, detail=f"{count[kind, node]} action(s)")
        for kind, node in keys
    ]


def held_reason(st: Status) -> str:
    """The reason of the episode's ``Held`` condition ("" when it is not held)."""
    return next((c.reason for c in st.conditions if c.type == "Held" and c.status == "True"), "")


def order_id(fingerprint: str, kind: str, attempt: int) -> str:
    return f"{fingerprint}-{kind}-{attempt}"


def kebab(reason: str) -> str:
    """``DrainTimeout`` -> ``drain-timeout`` (a label value)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", reason).lower()[:63].strip("-") or "escalated"


# -- status helpers (every function returns a new Status) -------------------------------


def _times(times: PhaseTimes, **changes: datetime | None) -> PhaseTimes:
    return msgspec.structs.replace(times, **changes)


def replace(st: Status, **changes: object) -> Status:
    return msgspec.structs.replace(st, **changes)


def enter(
    st: Status, phase: Phase, now: datetime, reason: str, message: str = "", **marks: datetime
) -> Status:
    """Move to ``phase``: its timestamp, the reason, and any stage marks (``drained=now``).
    Entering Returned marks ``validated``; ``returned`` is set when the quarantine is gone."""
    mark = "validated" if phase is Phase.RETURNED else phase.value.lower()
    times = _times(st.times, **{mark: now, **marks})
    conditions = set_condition(
        st.conditions, "Progressing", status="True", reason=reason, message=message, now=now
    )
    conditions = drop_condition(conditions, "Held")
    return replace(
        st, phase=phase, times=times, reason=reason, message=clip(message), conditions=conditions
    )


def wait(st: Status, now: datetime, reason: str, message: str = "") -> Status:
    """Stay in the phase, saying what the episode waits for."""
    conditions = set_condition(
        st.conditions, "Progressing", status="False", reason=reason, message=message, now=now
    )
    conditions = drop_condition(conditions, "Held")
    return replace(st, reason=reason, message=clip(message), conditions=conditions)


def held(st: Status, now: datetime, reason: str, message: str = "") -> Status:
    """Stay, held by an operator's choice (opt-out label, action disabled, dry-run)."""
    conditions = set_condition(
        st.conditions, "Held", status="True", reason=reason, message=message, now=now
    )
    conditions = set_condition(
        conditions, "Progressing", status="False", reason=reason, message=message, now=now
    )
    return replace(st, reason=reason, message=clip(message), conditions=conditions)


def set_condition(
    conditions: list[Condition],
    type_: str,
    *,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=clip(message),
        last_transition_time=since,
    )
    return [c for c in conditions if c.type != type_] + [new]


def drop_condition(conditions: list[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]
