"""How a step changes an episode's status (pure; every function returns a new ``Status``):
enter a phase, wait in it saying why, be held by an operator's choice (the opt-out label, an
action not enabled, dry-run: the disruptive steps stop and the phase's timeouts do not fire),
and the status conditions (``Progressing``, ``Held``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from gpuhealth.controller.remediation.model import Phase, PhaseTimes, Status, StatusCondition, clip


def held_reason(st: Status) -> str:
    """The reason of the episode's ``Held`` condition ("" when it is not held)."""
    return next((c.reason for c in st.conditions if c.type == "Held" and c.status == "True"), "")


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
    conditions: list[StatusCondition],
    type_: str,
    *,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: datetime,
) -> list[StatusCondition]:
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = StatusCondition(
        type=type_,
        status=status,
        reason=reason,
        message=clip(message),
        last_transition_time=since,
    )
    return [c for c in conditions if c.type != type_] + [new]


def drop_condition(conditions: list[StatusCondition], type_: str) -> list[StatusCondition]:
    return [c for c in conditions if c.type != type_]
