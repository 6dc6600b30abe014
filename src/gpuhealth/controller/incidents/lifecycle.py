"""On-call's lifecycle of an incident (pure): acknowledge, silence until a time, resolve.

The actions live in the ``GPUIncident`` object's ``spec.lifecycle``, each ``{by, at,
reason}`` (``silenced`` also ``until``); the API server's admission policy makes ``by`` the
requesting user (docs/operations.md "Incidents as objects"). The controller reads them back
through its watch and records in ``status.observedLifecycle`` which action it has seen, when,
and whether it applied to the incident as it is now (:class:`Seen`):

- an action already in the spec when an occurrence of the incident opens (an incident that
  closed and opens again keeps its object, and so its spec) belongs to the previous
  occurrence: seen, not applied (:func:`on_open`);
- an action added or changed while the incident is open applies (:func:`observe`):
  ``acknowledged`` and ``silenced`` (until ``until``) stop it from paging
  (:func:`paging`), ``resolved`` closes it and lifts its decision — an operator's documented
  action, positive evidence (the deciders lift it: the domain taint, the GPU's blame, the
  override);
- an action removed (an unacknowledge) is forgotten.

Actions are told apart by their own ``at``, never by the clocks of the machines involved
(on-call's clock writes ``at``, the controller's only ``seenAt``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

ActionName = Literal["acknowledged", "silenced", "resolved"]
ACTION_NAMES: tuple[ActionName, ...] = ("acknowledged", "silenced", "resolved")
Paging = Literal["paging", "acknowledged", "silenced"]
"""What an open incident's alert does: page, or stay quiet because on-call acknowledged or
silenced it."""


@dataclass(frozen=True, slots=True)
class OnCallAction:
    """One lifecycle action, as on-call wrote it."""

    by: str
    """The user who wrote it (checked by the API server's admission policy)."""
    at: datetime
    """When, by the writer's clock; it names the action (a new ``at`` is a new action)."""
    reason: str
    until: datetime | None = None
    """``silenced`` only: the silence ends then."""


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """``spec.lifecycle``: on-call's actions on one incident."""

    acknowledged: OnCallAction | None = None
    silenced: OnCallAction | None = None
    resolved: OnCallAction | None = None

    def action(self, name: ActionName) -> OnCallAction | None:
        value: OnCallAction | None = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class Seen:
    """What the controller made of one action."""

    at: datetime
    """The action's own ``at`` (which action this is)."""
    applied: bool
    """True: it applies to the incident as it is now; False: it was there before this
    occurrence of the incident opened."""
    seen_at: datetime
    """When the controller saw it (its own clock)."""


@dataclass(frozen=True, slots=True)
class ObservedLifecycle:
    """``status.observedLifecycle``: what the controller saw of each action."""

    acknowledged: Seen | None = None
    silenced: Seen | None = None
    resolved: Seen | None = None

    def seen(self, name: ActionName) -> Seen | None:
        value: Seen | None = getattr(self, name)
        return value


def on_open(lifecycle: Lifecycle, now: datetime) -> ObservedLifecycle:
    """A new occurrence opens: every action already there belongs to the previous one."""
    out = ObservedLifecycle()
    for name in ACTION_NAMES:
        act = lifecycle.action(name)
        if act is not None:
            out = replace(out, **{name: Seen(act.at, False, now)})
    return out


def observe(
    lifecycle: Lifecycle, observed: ObservedLifecycle, now: datetime
) -> tuple[ObservedLifecycle, tuple[ActionName, ...]]:
    """The spec as it is now against what was seen: the new observation and the actions that
    are new (added, or changed: another ``at``), which apply."""
    out = ObservedLifecycle()
    new: list[ActionName] = []
    for name in ACTION_NAMES:
        act = lifecycle.action(name)
        seen = observed.seen(name)
        if act is None:
            continue  # removed (or never there): nothing to remember
        if seen is not None and seen.at == act.at:
            out = replace(out, **{name: seen})
            continue
        out = replace(out, **{name: Seen(act.at, True, now)})
        new.append(name)
    return out, tuple(new)


def in_effect(
    lifecycle: Lifecycle, observed: ObservedLifecycle, name: ActionName
) -> OnCallAction | None:
    """The action ``name`` when it applies to the incident as it is now."""
    act = lifecycle.action(name)
    seen = observed.seen(name)
    if act is None or seen is None or seen.at != act.at or not seen.applied:
        return None
    return act


def paging(lifecycle: Lifecycle, observed: ObservedLifecycle, now: datetime) -> Paging:
    """Whether an open incident's alert pages now: silenced while ``until`` is ahead,
    acknowledged until it closes, else paging."""
    silenced = in_effect(lifecycle, observed, "silenced")
    if silenced is not None and silenced.until is not None and now < silenced.until:
        return "silenced"
    if in_effect(lifecycle, observed, "acknowledged") is not None:
        return "acknowledged"
    return "paging"


def resolution(action: OnCallAction) -> str:
    """The close reason of a resolved incident."""
    return f"resolved by {action.by}: {action.reason}"
