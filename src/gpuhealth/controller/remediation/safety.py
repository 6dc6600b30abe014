"""Safety: who may start, what holds an episode, and the one gate every disruptive write
passes (pure, except the gate's own state).

- the loop is off unless ``enabled``, and each action is enabled on its own;
- a Node labelled ``node-restriction.kubernetes.io/<prefix>-remediation=disabled``
  (``Keys.opt_out_label``) is never acted on (an episode in flight holds where it is);
- dry-run records the plan and changes nothing;
- at most ``min(max_concurrent, floor(max_fraction x GPU nodes))`` episodes (at least 1)
  are past Pending at once, oldest fault first;
- with ``max_unresolved_escalations`` Escalated episodes not yet released, nothing new
  starts (a systemic fault must not sweep through the fleet one batch at a time);
- every disruptive step (quarantine, evictions, a reset, a reboot) asks the
  :class:`HardWriteGate`. The controller's one decision point for hard writes,
  :class:`gpuhealth.controller.breaker.gate.WriteGate` (leadership and the circuit breaker that
  also gates node taints and DeviceTaintRules), implements it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gpuhealth.controller.breaker.gate import GateDecision, HardWrite, HardWriteGate
from gpuhealth.controller.names import OPT_OUT_VALUE, Keys
from gpuhealth.controller.remediation.facts import EpisodeAdmission, NodeFacts
from gpuhealth.controller.remediation.fault import REPEATED
from gpuhealth.controller.remediation.model import ACTIVE_PHASES, Episode, Phase, released_again
from gpuhealth.controller.remediation.settings import RemediationSettings

__all__ = [
    "TOO_MANY_ESCALATIONS",
    "GateDecision",
    "HardWrite",
    "HardWriteGate",
    "admission",
    "approval_required",
    "capability_gap",
    "concurrency_limit",
    "hold_reason",
    "unresolved_escalations",
]


TOO_MANY_ESCALATIONS = "TooManyEscalations"


def concurrency_limit(gpu_nodes: int, settings: RemediationSettings) -> int:
    s = settings.safety
    return max(1, min(s.max_concurrent, math.floor(s.max_fraction * gpu_nodes)))


def unresolved_escalations(episodes: Sequence[Episode], keys: Keys) -> int:
    def pending_release(ep: Episode) -> bool:
        return bool(released_again(ep.annotations, keys.release_annotation, ep.status))

    return sum(1 for ep in episodes if ep.phase is Phase.ESCALATED and not pending_release(ep))


def admission(
    ep: Episode,
    episodes: Sequence[Episode],
    *,
    gpu_nodes: int,
    settings: RemediationSettings,
    keys: Keys,
    held: Callable[[Episode], bool] = lambda _ep: False,
) -> EpisodeAdmission:
    """May a Pending episode start now? ``episodes``: every episode in the cluster."""
    escalated = unresolved_escalations(episodes, keys)
    if escalated >= settings.safety.max_unresolved_escalations:
        return EpisodeAdmission(
            False,
            TOO_MANY_ESCALATIONS,
            f"{escalated} escalated episodes are not released; new episodes wait",
        )
    limit = concurrency_limit(gpu_nodes, settings)
    active = sum(1 for e in episodes if e.phase in ACTIVE_PHASES)
    free = limit - active
    queue = sorted(
        (e for e in episodes if e.phase is Phase.PENDING and not held(e)),
        key=lambda e: (e.spec.fault.detected_at, e.name),
    )
    rank = next((i for i, e in enumerate(queue) if e.name == ep.name), len(queue))
    if rank >= free:
        return EpisodeAdmission(
            False,
            "ConcurrencyLimit",
            f"{active} of at most {limit} remediations in progress; {rank} older episodes queued",
        )
    return EpisodeAdmission(True)


def hold_reason(
    ep: Episode, node: NodeFacts, settings: RemediationSettings, keys: Keys
) -> tuple[str, str] | None:
    """Why an episode may take no disruptive step now (operator choices), or None."""
    if not settings.enabled:
        return ("RemediationDisabled", "remediation.enabled is false")
    action = ep.spec.action
    if ep.spec.fault.escalation_reason != REPEATED and not settings.action_enabled(action):
        return ("ActionDisabled", f"the {action} action is not enabled")
    if node.labels.get(keys.opt_out_label) == OPT_OUT_VALUE:
        return ("OptedOut", f"the node is labelled {keys.opt_out_label}={OPT_OUT_VALUE}")
    if settings.dry_run or ep.spec.dry_run:
        return ("DryRun", "dry-run: the plan is recorded, nothing is changed")
    return None


def approval_required(ep: Episode, settings: RemediationSettings) -> bool:
    """The stricter of the episode's spec and the current settings."""
    return ep.spec.approval_required or (
        ep.spec.action == "reboot" and settings.reboot.approval_required
    )


def needed_capabilities(ep: Episode, settings: RemediationSettings) -> frozenset[str]:
    """What the node's agent must be able to execute for this episode (``gpuhealth.protocol.v1``'s
    ``CAPABILITIES``): the action (a reboot only with ``executor: agent``), the validation,
    and the diagnostic when validation asks for it. An escalation needs nothing."""
    if ep.spec.action == "escalate":
        return frozenset()
    need = {"validate"}
    if ep.spec.action == "reset-gpu":
        need.add("reset-gpu")
    elif settings.reboot.executor == "agent":
        need.add("reboot")
    if settings.validation.diagnostic:
        need.add("diagnostic")
    return frozenset(need)


def capability_gap(
    ep: Episode, node: NodeFacts, settings: RemediationSettings
) -> tuple[bool, str] | None:
    """Can the node carry the episode out? None: yes. Else (known, message): ``known`` when
    the agent said what it can do and something is missing (the episode escalates before
    anything is disrupted), not ``known`` when an older agent says nothing (it waits)."""
    need = needed_capabilities(ep, settings)
    if not need:
        return None
    if node.capabilities is None:
        return (
            False,
            "the node's agent does not say what it can execute (an agent older than the "
            "Hello's capabilities, or none connected): nothing is disrupted until it does",
        )
    missing = sorted(need - node.capabilities)
    if not missing:
        return None
    return (
        True,
        f"the node's agent cannot execute {', '.join(missing)} (its remediation settings: "
        "remediation.enabled, reboot.executor, the diagnostic command); nothing was disrupted",
    )
