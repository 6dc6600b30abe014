"""Quarantined: the quarantine taint seen on the node, the facts checked again; an episode
whose verdict needs a person escalates here, every other one starts draining."""

from __future__ import annotations

from gpuhealth.controller.remediation.actions import Quarantine
from gpuhealth.controller.remediation.escalation import escalate
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.guards import hold_step, recheck
from gpuhealth.controller.remediation.model import Episode, Phase, replace_status
from gpuhealth.controller.remediation.pending import approval
from gpuhealth.controller.remediation.status import enter, wait
from gpuhealth.controller.remediation.step import Context, Step


def quarantined(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    """The quarantine taint seen on the node (and an approval, for an episode that reached
    Quarantined before approvals moved to Pending); the facts checked again; escalations
    stop here."""
    st, now = ep.status, obs.now
    hold = hold_step(ep, node, obs, cx)
    if hold is not None:
        return hold
    asked = approval(ep, obs, cx)
    if isinstance(asked, Step):
        return asked
    st = asked
    if not node.has_taint(cx.keys.quarantine_taint):
        return Step(
            wait(
                st,
                now,
                "AwaitingQuarantineTaint",
                f"waiting for the {cx.keys.quarantine_taint} taint",
            ),
            actions=(Quarantine(node.name),),
            requeue_after_s=cx.settings.quarantine_check_s,
        )
    if ep.spec.action == "escalate":
        reason = ep.spec.fault.escalation_reason or "ContactSupport"
        codes = ", ".join(sorted({g.code for g in ep.spec.fault.gpus}))
        return escalate(
            st, now, reason, f"the verdict ({codes}) needs a person", node=node.name, cx=cx
        )
    stale = recheck(replace_status(ep, st), node, obs, cx)
    if stale is not None:
        return stale
    return Step(enter(st, Phase.DRAINING, now, "Draining", "evicting the pods in scope"))
