"""Pending: verified against what the controller itself sees, not held, approved where a
reboot needs it, admitted (the concurrency and escalation caps): then quarantine."""

from __future__ import annotations

from gpuhealth.controller.names import EVENT_REMEDIATION_STARTED
from gpuhealth.controller.remediation.actions import Quarantine
from gpuhealth.controller.remediation.deadlines import deadline, seconds_until
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.fault import verify
from gpuhealth.controller.remediation.guards import awaiting_agent, capability_step, hold_step
from gpuhealth.controller.remediation.model import Episode, Phase, Status
from gpuhealth.controller.remediation.safety import approval_required
from gpuhealth.controller.remediation.status import enter, replace, wait
from gpuhealth.controller.remediation.step import Context, Note, Step


def pending(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    """Verified against what the controller itself sees, not held, admitted: quarantine."""
    st, now = ep.status, obs.now
    silent = awaiting_agent(ep, node, obs, cx)
    if silent is not None:
        return silent
    problem = verify(ep, node, cx.history, cx.settings)
    if problem is not None:
        reason, message = problem
        return Step(
            enter(st, Phase.FAILED, now, reason, message),
            notes=(Note("Warning", reason, message),),
        )
    hold = hold_step(ep, node, obs, cx)
    if hold is not None:
        return hold
    unable = capability_step(ep, node, obs, cx)
    if unable is not None:
        return unable
    asked = approval(ep, obs, cx)
    if isinstance(asked, Step):
        return asked
    st = asked
    if not obs.admission.allowed:
        return Step(wait(st, now, obs.admission.reason, obs.admission.message))
    gpus = ", ".join(f"{g.index} ({g.code})" for g in ep.spec.fault.gpus)
    message = f"{ep.spec.action} for GPU {gpus}"
    return Step(
        enter(st, Phase.QUARANTINED, now, "Admitted", message),
        actions=(Quarantine(node.name),),
        notes=(Note("Normal", EVENT_REMEDIATION_STARTED, message, node=True),),
    )


def approval(ep: Episode, obs: Observed, cx: Context) -> Status | Step:
    """A reboot waits for ``<prefix>/approve`` in Pending (no concurrency slot held), at most
    ``reboot.approval_expiry_s`` after its fault was detected: then the request has expired
    (Failed). Returns the status with the approver, or the step that waits or expires."""
    st, now = ep.status, obs.now
    if not approval_required(ep, cx.settings):
        return st
    approver = ep.annotations.get(cx.keys.approve_annotation, "")
    expires = deadline(ep.spec.fault.detected_at, cx.settings.reboot.approval_expiry_s, now)
    if now >= expires:
        what = "approved" if approver else "approved and"
        message = (
            f"not {what} admitted within {cx.settings.reboot.approval_expiry_s:g}s of the "
            "fault: the approval request expired"
        )
        return Step(
            enter(st, Phase.FAILED, now, "ApprovalExpired", message),
            notes=(Note("Warning", "ApprovalExpired", message),),
        )
    if not approver:
        how = f"annotate this GPURemediation {cx.keys.approve_annotation}=<your name>"
        message = f"a {ep.spec.action} needs approval: {how}"
        return Step(
            wait(st, now, "AwaitingApproval", message), requeue_after_s=seconds_until(expires, now)
        )
    return replace(st, approved_by=approver[:253])
