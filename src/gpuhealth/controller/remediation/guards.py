"""The checks every phase makes before a disruptive step (pure); each returns the step to take
instead, or None to go on: the node's agent reports (:func:`awaiting_agent`) and can carry the
episode out (:func:`capability_step`), the fault is still there on the same boot
(:func:`recheck`), and no operator's choice holds the episode (:func:`hold_step`; in dry run
with a :func:`preview` of what it would do)."""

from __future__ import annotations

from gpuhealth.controller.remediation.drain import plan_drain
from gpuhealth.controller.remediation.escalation import NO_EXECUTOR, escalate
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.fault import verify
from gpuhealth.controller.remediation.model import Episode, Phase, ValidationStatus
from gpuhealth.controller.remediation.safety import (
    TOO_MANY_ESCALATIONS,
    capability_gap,
    hold_reason,
)
from gpuhealth.controller.remediation.status import enter, held, replace, wait
from gpuhealth.controller.remediation.step import Context, Note, Step


def capability_step(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step | None:
    """Before anything disruptive: the node's agent can carry the episode out. An agent that
    cannot escalates the episode (``NoExecutor``, no RMA label), unless the escalation limit
    is reached (it waits, ``NoExecutor``); one that does not say waits
    (``CapabilitiesUnknown``). None: it can."""
    gap = capability_gap(ep, node, cx.settings)
    if gap is None:
        return None
    known, message = gap
    if known and obs.admission.reason == TOO_MANY_ESCALATIONS:
        # counted like every escalation: an agent-wide misconfiguration escalates at most
        # safety.max_unresolved_escalations nodes, the rest wait
        message = f"{message}; not escalated while {obs.admission.message}"
        return Step(
            wait(ep.status, obs.now, NO_EXECUTOR, message), requeue_after_s=cx.settings.resync_s
        )
    if known:
        return escalate(ep.status, obs.now, NO_EXECUTOR, message, node=node.name, cx=cx)
    return Step(
        wait(ep.status, obs.now, "CapabilitiesUnknown", message),
        requeue_after_s=cx.settings.resync_s,
    )


def awaiting_agent(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step | None:
    """Wait while the node's agent does not report to this controller (not connected yet
    after a restart or a leader change, silent): its facts cannot be checked, so nothing is
    decided on them. None: it reports."""
    if node.reporting == "ok":
        return None
    message = f"the node's agent is {node.reporting}: nothing disruptive without fresh facts"
    return Step(
        wait(ep.status, obs.now, "AwaitingAgent", message), requeue_after_s=cx.settings.resync_s
    )


def recheck(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step | None:
    """Fresh facts right before a disruptive step (the drain, each eviction round, each new
    order): the agent reports, and the fault is still there on the same boot. A fault gone
    or a node rebooted meanwhile sends the quarantined node to validation (nothing more
    is disrupted; it returns when clean); a spec the controller would not derive fails.
    None: go on."""
    st, now = ep.status, obs.now
    silent = awaiting_agent(ep, node, obs, cx)
    if silent is not None:
        return silent
    problem = verify(ep, node, cx.history, cx.settings)
    if problem is None:
        return capability_step(ep, node, obs, cx)
    reason, message = problem
    if reason not in ("FaultCleared", "BootChanged"):
        return Step(
            enter(st, Phase.FAILED, now, reason, message),
            notes=(Note("Warning", reason, message, node=True),),
        )
    attempt = st.validation.attempt + 1 if st.validation is not None else 1
    st = replace(st, validation=ValidationStatus(attempt=attempt, started_at=now), order=None)
    message = f"{message}; validating before return, nothing else is disrupted"
    return Step(
        enter(st, Phase.VALIDATING, now, reason, message),
        notes=(Note("Normal", reason, message, node=True),),
    )


def hold_step(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step | None:
    """The step of an episode an operator's choice holds, or None."""
    hold = hold_reason(ep, node, cx.settings, cx.keys)
    if hold is None:
        return None
    reason, message = hold
    if reason == "DryRun":
        message = f"{message}; {preview(ep, node, obs, cx)}"
    return Step(held(ep.status, obs.now, reason, message))


def preview(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> str:
    """What the episode would do (dry-run): the action and the pods it would evict."""
    plan = plan_drain(
        ep.spec,
        node,
        pods=obs.pods,
        gang_pods=obs.gang_pods,
        pdbs=obs.pdbs,
        previous_waiting=(),
        settings=cx.settings.drain,
        started=obs.now,
        now=obs.now,
        off_limits=obs.off_limits,
    )
    names = [f"{e.pod.namespace}/{e.pod.name}" for e in plan.evict][:10]
    more = f" (+{len(plan.evict) - len(names)} more)" if len(plan.evict) > len(names) else ""
    if plan.over_cap:
        return f"would {ep.spec.action} ({ep.spec.scope} scope), but held: {plan.over_cap}"
    return (
        f"would {ep.spec.action} ({ep.spec.scope} scope) after evicting {len(plan.evict)} pod(s)"
        f": {', '.join(names) or 'none'}{more}; {len(plan.waiting)} would wait"
    )
