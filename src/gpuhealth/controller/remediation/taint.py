"""The quarantine taint an episode holds on its node (pure): input to the taint writer.

The loop never writes taints itself: ``spec.taints`` is an atomic list with one writer in
the controller (the reconciler, behind the circuit breaker), which removes every taint
under the prefix it does not want. So the reconciler adds the result of
:func:`quarantine_taint` to a node's desired taints; the episode's Quarantined phase waits
until it sees the taint, and Returned records the moment it is gone.

An episode holds the node from Quarantined until Returned, and keeps holding it when it
escalates or fails after quarantine (a person decides; ``<prefix>/release`` re-validates),
except when an operator ended it by taking the quarantine away (removing the taint by hand,
or excluding the node): then the node is theirs, and the taint is not put back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.taints.policy import Taint

HOLDING_PHASES = frozenset(
    {Phase.QUARANTINED, Phase.DRAINING, Phase.REMEDIATING, Phase.VALIDATING, Phase.ESCALATED}
)
EFFECT = "NoSchedule"
QUARANTINE_REMOVED = "QuarantineRemoved"
EXCLUDED = "Excluded"
GIVEN_UP = frozenset({QUARANTINE_REMOVED, EXCLUDED})
"""Failed reasons of an episode an operator ended by taking its quarantine away."""


@dataclass(frozen=True, slots=True)
class QuarantineTaint:
    key: str
    value: str
    effect: str = EFFECT


def holds_quarantine(ep: Episode) -> bool:
    if ep.replaced:
        return False  # its node is gone: a new Node of the name is another node
    if ep.phase in HOLDING_PHASES:
        return True
    return (
        ep.phase is Phase.FAILED
        and ep.status.times.quarantined is not None
        and ep.status.reason not in GIVEN_UP
    )


def quarantine_taint(episodes: Iterable[Episode], node: str, keys: Keys) -> QuarantineTaint | None:
    """The taint ``node`` must carry because of its episodes, or None."""
    holding = [ep for ep in episodes if ep.node == node and holds_quarantine(ep)]
    if not holding:
        return None
    ep = min(holding, key=lambda e: (e.spec.fault.detected_at, e.name))
    value = "escalated" if ep.phase in (Phase.ESCALATED, Phase.FAILED) else ep.spec.action
    return QuarantineTaint(keys.quarantine_taint, value)


def current_quarantine(taints: Iterable[Mapping[str, Any]], keys: Keys) -> Taint | None:
    """The quarantine taint a node carries now, or None (kept as it is while the episodes
    are not known yet)."""
    for t in taints:
        if t.get("key") == keys.quarantine_taint:
            return Taint(keys.quarantine_taint, str(t.get("value") or ""), str(t.get("effect", "")))
    return None
