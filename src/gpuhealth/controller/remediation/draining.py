"""Draining: evict the pods in scope in rounds (the plan: :mod:`drain`) until none is left;
the blast-radius cap and the drain timeout escalate."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec

from gpuhealth.controller.remediation.actions import Act, Evict, ForceDelete
from gpuhealth.controller.remediation.deadlines import deadline, earliest, seconds_until
from gpuhealth.controller.remediation.drain import DrainPlan, plan_drain
from gpuhealth.controller.remediation.escalation import escalate
from gpuhealth.controller.remediation.facts import BreakerRoom, NodeFacts, Observed
from gpuhealth.controller.remediation.guards import hold_step, recheck
from gpuhealth.controller.remediation.model import (
    MAX_LISTED_PODS,
    Episode,
    Phase,
    PodRecord,
    Status,
    clip,
)
from gpuhealth.controller.remediation.status import enter, held, replace, wait
from gpuhealth.controller.remediation.step import Context, Note, Step

RETRY_REASONS = frozenset({"pdb-blocked", "error"})
"""Refusals kept in the waiting list between eviction rounds (the pod is tried again)."""


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
    if plan.evict and not plan.over_cap and obs.breaker is not None:
        plan = room_check(plan, node.name, obs.breaker, now)
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


def room_check(plan: DrainPlan, node: str, room: BreakerRoom, now: datetime) -> DrainPlan:
    """The round's evictions land on ``node`` and on every node of their gang members: they
    fit the circuit breaker's remaining room all together, or the drain evicts nothing and
    is held (``BlastRadiusCap``) without asking the breaker, which would count the first
    nodes and open on the next (a fleet-wide stop for one gang, nothing evicted). An open
    breaker is the gate's to refuse (``BreakerOpen``, released by an operator's reset)."""
    if room.open:
        return plan
    landing = {node} | {e.pod.node for e in plan.evict if e.pod.node}
    if room.fits(landing):
        return plan
    new = room.new(landing)
    why = (
        f"the drain would disrupt {len(new)} node(s) the circuit breaker has not admitted "
        f"({', '.join(sorted(new)[:5])}{' ...' if len(new) > 5 else ''}); it has room for "
        f"{room.free} more now (breaker.max_fraction, breaker.min_nodes, breaker.window_s)"
    )
    waiting = tuple(
        PodRecord(
            namespace=e.pod.namespace,
            name=e.pod.name,
            uid=e.pod.uid,
            node=e.pod.node,
            gang=e.gang[:512],
            reason="over-cap",
            message=clip(why, 256),
            at=now,
        )
        for e in plan.evict
    )
    return dataclasses.replace(
        plan, evict=(), freeze=(), waiting=(*plan.waiting, *waiting), over_cap=why
    )


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
