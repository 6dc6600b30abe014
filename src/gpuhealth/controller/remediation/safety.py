"""Safety: who may start, what holds an episode, and the one gate every disruptive write
passes (pure, except the gate's own state).

- the loop is off unless ``enabled``, and each action is enabled on its own;
- a Node labelled ``node-restriction.kubernetes.io/<prefix>-remediation=disabled``
  (``Keys.opt_out_label``) is never acted on (an episode in flight holds where it is);
- nor is a node whose repair a managed repairer owns (``remediation.managed_repair``,
  :mod:`gpuhealth.controller.remediation.managed_repair`: held, ``ManagedRepair``);
- dry-run records the plan and changes nothing;
- at most ``min(max_concurrent, floor(max_fraction x GPU nodes))`` episodes (at least 1)
  are past Pending at once, oldest fault first, and within each named node pool
  (``gpuhealth.controller.fleet.pools``) at most ``min(pool_max_concurrent, floor(
  pool_max_fraction x the pool's GPU nodes))`` (at least 1): one storming pool takes no more
  than its own share of the fleet's slots, and waits without holding the other pools back;
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
from gpuhealth.controller.fleet.pools import NO_POOL
from gpuhealth.controller.names import OPT_OUT_VALUE, Keys
from gpuhealth.controller.remediation.facts import EpisodeAdmission, NodeFacts
from gpuhealth.controller.remediation.fault import REPEATED
from gpuhealth.controller.remediation.managed_repair import repair_owner
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
    "pool_concurrency_limit",
    "unresolved_escalations",
]


MANAGED_REPAIR = "ManagedRepair"
"""The hold of an episode whose node a managed repairer owns."""

TOO_MANY_ESCALATIONS = "TooManyEscalations"


def concurrency_limit(
    gpu_nodes: int, settings: RemediationSettings, part: int | None = None
) -> int:
    """``part``: past one process, this owner's part of ``max_concurrent`` (the shards' parts
    add up to it: a part of 0 starts nothing, where one process always may start one)."""
    s = settings.safety
    if part is not None:
        return min(part, max(1, math.floor(s.max_fraction * gpu_nodes)))
    return max(1, min(s.max_concurrent, math.floor(s.max_fraction * gpu_nodes)))


def pool_concurrency_limit(pool_nodes: int, settings: RemediationSettings) -> int:
    """A named pool's cap (``safety.pool_max_concurrent`` and ``pool_max_fraction``, each the
    fleet-wide one's when unset), over the pool's GPU nodes; at least 1."""
    s = settings.safety
    most = s.pool_max_concurrent if s.pool_max_concurrent is not None else s.max_concurrent
    fraction = s.pool_max_fraction if s.pool_max_fraction is not None else s.max_fraction
    return max(1, min(most, math.floor(fraction * pool_nodes)))


def unresolved_escalations(episodes: Sequence[Episode], keys: Keys) -> int:
    def pending_release(ep: Episode) -> bool:
        return bool(released_again(ep.annotations, keys.release_annotation, ep.status))

    return sum(
        1
        for ep in episodes
        if ep.phase is Phase.ESCALATED and not pending_release(ep) and not ep.replaced
    )


def admission(
    ep: Episode,
    episodes: Sequence[Episode],
    *,
    gpu_nodes: int,
    settings: RemediationSettings,
    keys: Keys,
    held: Callable[[Episode], bool] = lambda _ep: False,
    pool_of: Callable[[str], str] = lambda _node: NO_POOL,
    pool_nodes: Callable[[str], int] = lambda _pool: 0,
    every_episode: Sequence[Episode] | None = None,
    part: int | None = None,
) -> EpisodeAdmission:
    """May a Pending episode start now? ``episodes``: every episode in the cluster (past one
    process, those of this owner's shards, with ``part`` its part of ``max_concurrent``, and
    ``every_episode`` the cluster's: the escalation guard stays fleet-wide, every replica
    watching every episode); ``pool_of``: a node's pool, ``pool_nodes``: a pool's GPU nodes.

    The queue is every Pending episode not held, oldest fault first. Walking it, an episode
    whose pool has no free slot is passed over (it takes none of the fleet's), and the fleet's
    free slots go to the first of the others: so one storming pool waits within its own cap
    and the other pools' episodes go on."""
    escalated = unresolved_escalations(
        every_episode if every_episode is not None else episodes, keys
    )
    if escalated >= settings.safety.max_unresolved_escalations:
        return EpisodeAdmission(
            False,
            TOO_MANY_ESCALATIONS,
            f"{escalated} escalated episodes are not released; new episodes wait",
        )
    limit = concurrency_limit(gpu_nodes, settings, part)
    active_eps = [e for e in episodes if e.phase in ACTIVE_PHASES]
    free = limit - len(active_eps)
    pool_free: dict[str, int] = {}

    def room(pool: str) -> int:
        if pool not in pool_free:
            in_pool = sum(1 for e in active_eps if pool_of(e.node) == pool)
            pool_free[pool] = pool_concurrency_limit(pool_nodes(pool), settings) - in_pool
        return pool_free[pool]

    queue = sorted(
        (e for e in episodes if e.phase is Phase.PENDING and not held(e)),
        key=lambda e: (e.spec.fault.detected_at, e.name),
    )
    taken = 0
    for e in queue:
        pool = pool_of(e.node)
        if pool != NO_POOL and room(pool) <= 0:
            if e.name == ep.name:
                cap = pool_concurrency_limit(pool_nodes(pool), settings)
                return EpisodeAdmission(
                    False,
                    "PoolConcurrencyLimit",
                    f"{cap - room(pool)} of at most {cap} remediations in progress in node "
                    f"pool {pool}",
                )
            continue
        if e.name == ep.name:
            break
        taken += 1
        if pool != NO_POOL:
            pool_free[pool] -= 1
    if taken >= free:
        return EpisodeAdmission(
            False,
            "ConcurrencyLimit",
            f"{len(active_eps)} of at most {limit} remediations in progress; {taken} older "
            "episodes queued",
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
    owner = repair_owner(node.labels, node.conditions, settings.managed_repair)
    if owner is not None:
        return (
            MANAGED_REPAIR,
            f"{owner.owner} owns the repair of this node ({owner.signal}): gpuhealth keeps its "
            "taint and takes no disruptive step; the managed service repairs",
        )
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
