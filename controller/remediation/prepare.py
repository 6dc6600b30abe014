"""Pending -> Quarantined -> Draining -> (drained): getting the node ready for the action."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec

from gpuhealth.controller.remediation.actions import (
    Act,
    Evict,
    ForceDelete,
    Note,
    Quarantine,
    Step,
    enter,
    held,
    replace,
    wait,
)
from gpuhealth.controller.remediation.context import (
    Context,
    awaiting_agent,
    capability_step,
    deadline,
    earliest,
    escalate,
    hold_step,
    recheck,
    seconds_until,
)
from gpuhealth.controller.remediation.drain import DrainPlan, plan_drain
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.fault import verify
from gpuhealth.controller.remediation.model import (
    MAX_LISTED_PODS,
    Episode,
    Phase,
    PodRecord,
    Status,
    replace_status,
)
from gpuhealth.controller.remediation.safety import approval_required

RETRY_REASONS = frozenset({"pdb-blocked", "error"})
"""Refusals kept in the waiting list between eviction rounds (the pod is tried again)."""


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
        notes=(Note("Normal", "RemediationStarted", message, node=True),),
    )


def approval(ep: Episode, obs: Observed, cx: Context) -> Status | Step:
    """A reboot waits for ``<prefix>/approve`` in Pending (no concurrency slot held), at most
    ``reboot.approval_expiry_s`` after its fault was detected: then the request has expired
    (Failed). Returns the status with the approver, or the step that waits or expires."""
    st, now = ep.status, obs.now
    if not approval_required(ep, cx.settings):
        return st
    approver = ep.annotations.get(cx.keys.approve, "")
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
        how = f"annotate this GPURemediation {cx.keys.approve}=<your name>"
        message = f"a {ep.spec.action} needs approval: {how}"
        return Step(
            wait(st, now, "AwaitingApproval", message), requeue_after_s=seconds_until(expires, now)
        )
    return replace(st, approved_by=approver[:253])


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
    if not node.has_taint(cx.keys.taint):
        return Step(
            wait(st, now, "AwaitingQuarantineTaint", f"waiting for the {cx.keys.taint} taint"),
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


def keep_times(new: Sequence[PodRecord], old: Sequence[PodRecord]) -> list[PodRecord]:
    """A pod still waiting for the same reason keeps the time it began to: a drain that
    waits (a budget, a hold) leaves the status as it is, and it is not written every round."""
    since = {(w.uid, w.reason, w.message): w.at for w in old}
    return [
        msgspec.structs.replace(w, at=since.get((w.uid, w.reason, w.message), w.at)) for w in new
    ]


def summary(plan: DrainPlan) -> str:
    reasons: dict[str, int] = {}
    for w in plan.waiting:
        reasons[w.reason] = reasons.get(w.reason, 0) + 1
    waits = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    text = f"{plan.targets} pod(s) left, {len(plan.evict)} to evict"
    return text + (f"; waiting: {waits}" if waits else "")


def draining(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    """Evict in rounds (every ``retry_s``) until no pod in scope is left; the timeout
    escalates, or with ``on_timeout: force`` first deletes stuck terminating pods."""
    st, now, ds = ep.status, obs.now, cx.settings.drain
    hold = hold_step(ep, node, obs, cx)
    if hold is not None:
        return hold
    started = st.times.draining or now
    plan = plan_drain(
        ep.spec,
        node,
        pods=obs.pods,
        gang_pods=obs.gang_pods,
        pdbs=obs.pdbs,
        previous_waiting=st.waiting_pods,
        settings=ds,
        started=started,
        now=now,
        frozen=st.frozen_gangs,
        touched=st.touched_nodes,
        evicted_count=st.evicted_count,
        off_limits=obs.off_limits,
    )
    if plan.done:
        done = replace(
            st,
            waiting_pods=[],
            waiting_count=0,
            boot_id_before=node.boot_id,
            attempts=0,
            order=None,
        )
        message = f"{st.evicted_count} pod(s) evicted"
        return Step(enter(done, Phase.REMEDIATING, now, "Drained", message, drained=now))
    retrying = {e.pod.uid for e in plan.evict}
    refused = [w for w in st.waiting_pods if w.uid in retrying and w.reason in RETRY_REASONS]
    plan = dataclasses.replace(plan, waiting=(*plan.waiting, *refused)) if refused else plan
    listed = keep_times(plan.waiting[:MAX_LISTED_PODS], st.waiting_pods)
    st = replace(st, waiting_pods=listed, waiting_count=len(plan.waiting))
    end = deadline(started, ds.timeout_s, now)
    if now >= end:
        stuck_only = not plan.evict and all(w.reason == "terminating" for w in plan.waiting)
        if ds.on_timeout == "force" and plan.force and stuck_only:
            forced: tuple[Act, ...] = tuple(ForceDelete(p) for p in plan.force)
            return Step(
                wait(st, now, "ForcingStuckPods", summary(plan)),
                actions=forced,
                requeue_after_s=ds.retry_s,
            )
        message = f"drain not done after {ds.timeout_s:g}s: {summary(plan)}"
        return escalate(st, now, "DrainTimeout", message, node=node.name, cx=cx)
    if plan.over_cap:
        return over_cap(st, plan, now, end, cx)
    last = st.drain_attempt_at
    due_in = 0.0
    if last is not None:
        due_in = max(0.0, (last + timedelta(seconds=ds.retry_s) - now).total_seconds())
    actions: tuple[Act, ...] = ()
    if plan.evict and due_in == 0.0:
        stale = recheck(ep, node, obs, cx)
        if stale is not None:
            return stale
        actions = tuple(Evict(e) for e in plan.evict)
        elsewhere = {e.pod.node for e in plan.evict if e.pod.node and e.pod.node != node.name}
        st = replace(
            st,
            drain_attempt_at=now,
            frozen_gangs=[*st.frozen_gangs, *plan.freeze],
            touched_nodes=sorted({*st.touched_nodes, *elsewhere}),
        )
        due_in = ds.retry_s
    return Step(
        wait(st, now, "Draining", summary(plan)),
        actions=actions,
        requeue_after_s=earliest(
            due_in or ds.retry_s, seconds_until(plan.next_change, now), seconds_until(end, now)
        ),
    )


BLAST_RADIUS = "BlastRadiusCap"


def over_cap(st: Status, plan: DrainPlan, now: datetime, end: datetime, cx: Context) -> Step:
    """The drain would pass a blast-radius cap: nothing is evicted (never part of a gang),
    the episode is held with a Warning Event when the hold begins; the drain timeout still
    escalates it to a person."""
    message = f"{plan.over_cap}; nothing evicted, escalates at the drain timeout"
    notes = (
        () if st.reason == BLAST_RADIUS else (Note("Warning", BLAST_RADIUS, message, node=True),)
    )
    return Step(
        held(st, now, BLAST_RADIUS, message),
        notes=notes,
        requeue_after_s=earliest(cx.settings.drain.retry_s, seconds_until(end, now)),
    )
