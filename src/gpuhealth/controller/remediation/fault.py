"""A node fault, its identity, and the action it calls for (pure).

A *signal* is one failed GPU's primary condition: (boot id, GPU UUID, condition code, the
time the agent first saw it). An episode's identity is the hash of its node and signals,
and its name derives from that hash, so:

- a controller restart, a leader change or a repeated event finds the same name (the
  create answers 409 AlreadyExists) and never starts a second episode;
- a signal any earlier episode of the node already covered is never handled again, even
  when a stale event delivers it after that episode returned the node (NVSentinel #1415);
- a new fault (the same XID again later, another GPU) has a new ``since`` and is a new
  episode.

:func:`verify` re-derives an episode's spec from what the controller itself observes
before anything disruptive happens: a hand-made GPURemediation (someone with create rights
on the CRD) cannot order a reset or a reboot the controller would not have ordered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuhealth.controller.fleet.health import NVLINK_DOMAIN_SCOPE
from gpuhealth.controller.names import EXCLUDE_VALUE, OPT_OUT_VALUE, Keys
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts
from gpuhealth.controller.remediation.model import (
    Action,
    Episode,
    Fault,
    FaultGpu,
    Phase,
    Scope,
    Spec,
    clip,
)
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.controller.remediation.taint import holds_quarantine
from gpuhealth.controller.taints.mig_scope import INSTANCE_SCOPES
from gpuhealth.protocol import Condition

MAX_NAME = 253
FINGERPRINT_CHARS = 16
_ACTION_RANK: dict[str, int] = {"reset-gpu": 1, "reboot": 2, "escalate": 3}
REPEATED = "RepeatedFaults"
SHARED_DOMAIN = "SharedDomainFault"
"""Escalation reason: a fault of the shared NVLink fabric (scope ``nvlink-domain``), which no
reset or reboot of one node can fix."""

SignalKey = tuple[str, str, str, str]


def _since_key(since: datetime | None) -> str:
    return since.isoformat() if since is not None else ""


def _primary(gpu: GpuFacts) -> Condition | None:
    """The oldest condition at the GPU's severity: the root cause (XID 79 before the
    GPU-lost it leads to), which later conditions never replace."""
    at_state = [c for c in gpu.conditions if c.severity == gpu.state] or list(gpu.conditions)
    if not at_state:
        return None
    return min(
        at_state,
        key=lambda c: (c.since.timestamp() if c.since is not None else float("inf"), c.code),
    )


def failed_gpus(node: NodeFacts) -> list[FaultGpu]:
    """The node's unhealthy GPUs, each with its primary condition, by index."""
    out = []
    for g in sorted(node.gpus, key=lambda g: g.index):
        if g.state != "unhealthy":
            continue
        c = _primary(g)
        out.append(
            FaultGpu(
                uuid=g.uuid,
                index=g.index,
                code=c.code if c else "gpu-unhealthy",
                reason=c.reason if c else "",
                action=c.action if c else "",
                since=c.since if c else None,
                message=clip(c.message) if c else "",
                scope=(c.scope or "") if c else "",
            )
        )
    return out


def signal_key(boot_id: str, g: FaultGpu) -> SignalKey:
    return (boot_id, g.uuid, g.code, _since_key(g.since))


def handled_signals(history: Iterable[Episode]) -> set[SignalKey]:
    return {signal_key(ep.spec.fault.boot_id, g) for ep in history for g in ep.spec.fault.gpus}


def fingerprint(node: str, boot_id: str, gpus: Sequence[FaultGpu]) -> str:
    h = hashlib.sha256(f"{node}\n{boot_id}".encode())
    for g in sorted(gpus, key=lambda g: (g.uuid, g.code)):
        h.update(f"\n{g.uuid}\t{g.code}\t{_since_key(g.since)}".encode())
    return h.hexdigest()[:FINGERPRINT_CHARS]


def episode_name(node: str, fp: str) -> str:
    """``<node>-<fingerprint>``; a long node name is cut (the hash covers the full name)."""
    head = node[: MAX_NAME - FINGERPRINT_CHARS - 1].rstrip("-.")
    return f"{head}-{fp}"


def scoped_action(action: Action, scope: str) -> Action:
    """The action one GPU's fault calls for, bounded by the driver's impact scope (pure):

    - ``nvlink-domain``: ``escalate`` (a reset or reboot of one node cannot fix a shared
      fabric; the NVLink domain incident, when the judge opens one, holds the domain's
      resets and reboots and names the decision to the operator);
    - ``gpu-instance`` / ``compute-instance``: never a node reboot by itself (``reboot``
      becomes ``reset-gpu``; ``escalate`` stays);
    - anything else (``gpu``, ``node``, not known): the verdict's action as mapped.
    """
    if scope == NVLINK_DOMAIN_SCOPE:
        return "escalate"
    if scope in INSTANCE_SCOPES and action == "reboot":
        return "reset-gpu"
    return action


def choose_action(gpus: Sequence[FaultGpu], settings: RemediationSettings) -> Action | None:
    """The strongest action the failed GPUs call for (each bounded by its scope:
    :func:`scoped_action`); None when any of them has a verdict action the loop does not
    handle (a person decides)."""
    best: Action | None = None
    for g in gpus:
        action = settings.action_map.get(g.action)
        if action is None:
            return None
        mapped = scoped_action(action, g.scope)
        if best is None or _ACTION_RANK[mapped] > _ACTION_RANK[best]:
            best = mapped
    return best


def recent_episodes(history: Iterable[Episode], before: datetime, window_s: float) -> int:
    start = before - timedelta(seconds=window_s)
    return sum(1 for ep in history if start <= ep.spec.fault.detected_at < before)


def expired(episodes: Iterable[Episode], now: datetime, history_s: float) -> list[Episode]:
    """Finished episodes older than ``history_s`` that hold nothing: Returned ones (the
    quarantine lifted), and Failed ones that hold no quarantine (never quarantined, or an
    operator took it away). Escalated episodes, and Failed ones that hold the quarantine,
    stay until an operator releases or deletes them."""
    horizon = now - timedelta(seconds=history_s)
    out = []
    for ep in episodes:
        t = ep.status.times
        done = t.returned if ep.phase is Phase.RETURNED else None
        if ep.phase is Phase.FAILED and not holds_quarantine(ep):
            done = t.failed
        if done is not None and done < horizon:
            out.append(ep)
    return out


@dataclass(frozen=True, slots=True)
class Proposal:
    """A new episode to create, or why none starts (``spec`` None)."""

    spec: Spec | None
    name: str = ""
    reason: str = ""


def _scope(action: Action, settings: RemediationSettings) -> Scope:
    return settings.reset_gpu.scope if action == "reset-gpu" else "node"


def expected_spec(
    node: str,
    boot_id: str,
    gpus: Sequence[FaultGpu],
    *,
    detected_at: datetime,
    history: Sequence[Episode],
    settings: RemediationSettings,
) -> Spec | None:
    """The spec the controller gives a fault (None: no action for it)."""
    action = choose_action(gpus, settings)
    if action is None:
        return None
    reason = ""
    repeats = recent_episodes(history, detected_at, settings.safety.repeat_window_s)
    if action != "escalate" and repeats >= settings.safety.repeat_limit:
        action, reason = "escalate", REPEATED
    elif action == "escalate" and any(g.scope == NVLINK_DOMAIN_SCOPE for g in gpus):
        reason = SHARED_DOMAIN
    recommended = max(
        (g.action for g in gpus), key=lambda a: _ACTION_RANK.get(settings.action_map.get(a, ""), 0)
    )
    fault = Fault(
        fingerprint=fingerprint(node, boot_id, gpus),
        boot_id=boot_id,
        detected_at=detected_at,
        gpus=list(gpus),
        recommended_action=recommended,
        escalation_reason=reason,
    )
    return Spec(
        node_name=node,
        action=action,
        scope=_scope(action, settings),
        fault=fault,
        approval_required=action == "reboot" and settings.reboot.approval_required,
        dry_run=settings.dry_run,
    )


def propose(
    node: NodeFacts,
    history: Sequence[Episode],
    settings: RemediationSettings,
    keys: Keys,
    now: datetime,
) -> Proposal:
    """Should a new episode start for this node now? ``history``: the node's episodes."""
    if not settings.enabled:
        return Proposal(None, reason="RemediationDisabled")
    if node.labels.get(keys.opt_out_label) == OPT_OUT_VALUE:
        return Proposal(None, reason="OptedOut")
    if node.labels.get(keys.exclude_label) == EXCLUDE_VALUE:
        return Proposal(None, reason="Excluded")
    if node.reporting != "ok" or not node.boot_id:
        return Proposal(None, reason="NoVerdict")
    if any(not ep.terminal for ep in history):
        return Proposal(None, reason="EpisodeActive")
    if any(ep.phase is Phase.ESCALATED for ep in history):
        return Proposal(None, reason="Escalated")  # stopped until an operator resolves it
    if any(ep.phase is Phase.FAILED and holds_quarantine(ep) for ep in history):
        # aborted (or failed) after the quarantine, which it keeps: the node waits for an
        # operator's release (re-validated) or for the episode's deletion, like an escalation
        return Proposal(None, reason="QuarantineHeld")
    handled = handled_signals(history)
    gpus = [g for g in failed_gpus(node) if signal_key(node.boot_id, g) not in handled]
    if not gpus:
        return Proposal(None, reason="NoNewFault")
    spec = expected_spec(
        node.name, node.boot_id, gpus, detected_at=now, history=history, settings=settings
    )
    if spec is None:
        return Proposal(None, reason="NoAction")
    if spec.fault.escalation_reason != REPEATED and not settings.action_enabled(spec.action):
        return Proposal(None, reason="ActionDisabled")
    return Proposal(spec, name=episode_name(node.name, spec.fault.fingerprint))


DETECTED_AT_SKEW_S = 300.0
"""How far a spec's ``fault.detectedAt`` may be from the object's creation time (set by the
API server): the controller writes its own clock's time just before it creates the object,
so only clock skew separates them. A forged detectedAt (to dodge the repeat limit or jump
the admission queue) is further off."""


def _reported(g: FaultGpu, node: NodeFacts) -> FaultGpu | None:
    """The spec's failed GPU as the node's agent reports it now (None: not reported)."""
    facts = node.gpu(g.uuid)
    if facts is None or facts.state != "unhealthy":
        return None
    for c in facts.conditions:
        if c.code == g.code and _since_key(c.since) == _since_key(g.since):
            return FaultGpu(
                uuid=g.uuid,
                index=facts.index,
                code=c.code,
                reason=c.reason,
                action=c.action,
                since=c.since,
                message=g.message,  # informational (the agent may reword it)
                scope=c.scope or "",
            )
    return None


def verify(
    ep: Episode, node: NodeFacts, history: Sequence[Episode], settings: RemediationSettings
) -> tuple[str, str] | None:
    """Does the controller itself see this episode's fault, and would it have chosen this
    spec? Every field is checked against what the node's agent reports now: the boot id,
    each GPU's index, condition, reason, recommended action and first-seen time, the action,
    its scope (never narrower than the controller's), the fault's recommended action and
    escalation reason, and ``detectedAt`` (within :data:`DETECTED_AT_SKEW_S` of the object's
    creation). ``approvalRequired`` and ``dryRun`` can only add to what the settings ask
    (``safety.approval_required`` and ``hold_reason`` take the stricter). None when yes,
    else (reason, message)."""
    fault = ep.spec.fault
    if node.boot_id != fault.boot_id:
        return ("BootChanged", f"the node booted ({node.boot_id}) since the fault was seen")
    current = []
    for g in fault.gpus:
        now = _reported(g, node)
        if now is None:
            return ("FaultCleared", f"GPU {g.index} ({g.uuid}) no longer reports {g.code}")
        current.append(now)
    mismatch = "SpecMismatch"
    if ep.created is not None:
        skew = abs((ep.created - fault.detected_at).total_seconds())
        if skew > DETECTED_AT_SKEW_S:
            return (
                mismatch,
                f"detectedAt {fault.detected_at.isoformat()} is {skew:.0f}s from the "
                f"object's creation ({ep.created.isoformat()})",
            )
    earlier = [h for h in history if h.name != ep.name]
    want = expected_spec(
        ep.node,
        fault.boot_id,
        current,
        detected_at=fault.detected_at,
        history=earlier,
        settings=settings,
    )
    if (
        want is None
        or ep.name != episode_name(ep.node, want.fault.fingerprint)
        or want.fault != fault
        or want.action != ep.spec.action
    ):
        return (mismatch, "the spec is not what the controller derives from this fault")
    if ep.spec.scope not in (want.scope, "node"):
        return (mismatch, f"scope {ep.spec.scope} is narrower than the controller's {want.scope}")
    return None
