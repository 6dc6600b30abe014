"""What the runner's actions did, folded back into the episode's status (pure): evictions
(evicted, blocked by a PodDisruptionBudget, gone, failed), deliveries of orders, validation
pods created, a node's replacement, errors, and the hard-write gate's refusals.

Evictions are written ahead: :func:`reserve_evictions` counts a round's pods as evicted
(``evicting``, in ``evictedPods`` and ``evictedCount``) in the status written before the
first eviction, with the round's ``frozenGangs`` and ``touchedNodes``; :func:`record_evictions`
then settles each (evicted, or given back to the count when refused). A status write lost
after the evictions leaves the count high, never low: the blast-radius caps never undercount."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import msgspec

from gpuhealth.controller.breaker.gate import GateDecision, HardWrite
from gpuhealth.controller.names import (
    EVENT_NODE_REPLACEMENT_FAILED,
    EVENT_NODE_REPLACEMENT_REQUESTED,
    NODECLAIM_KIND,
)
from gpuhealth.controller.remediation.actions import ReplaceNode
from gpuhealth.controller.remediation.drain import Eviction
from gpuhealth.controller.remediation.facts import PodFacts
from gpuhealth.controller.remediation.model import (
    MAX_LISTED_PODS,
    PodRecord,
    ReplacementState,
    ReplacementStatus,
    Status,
    clip,
)
from gpuhealth.controller.remediation.orders import mark_delivered
from gpuhealth.controller.remediation.status import replace, wait
from gpuhealth.controller.remediation.step import Note

ReplaceOutcome = Literal["deleted", "not-found", "mismatch"]
"""``deleted``: the API server accepted the delete of the NodeClaim or the Node;
``not-found``: it does not exist (404); ``mismatch``: it is not the node's any more (another
UID, another node or pool, a Node no longer cordoned): nothing deleted."""

EvictionOutcome = Literal["evicted", "blocked", "gone", "error"]
"""``evicted``: accepted (the pod terminates); ``blocked``: 429, a PodDisruptionBudget
refuses it now; ``gone``: 404, or the UID precondition failed (replaced); ``error``: other."""


@dataclass(frozen=True, slots=True)
class EvictionResult:
    pod: PodFacts
    gang: str
    outcome: EvictionOutcome
    message: str = ""


def _record(pod: PodFacts, gang: str, reason: str, message: str, now: datetime) -> PodRecord:
    return PodRecord(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node,
        gang=gang[:512],
        reason=reason,
        message=clip(message, 256),
        at=now,
    )


EVICTING = "evicting"
"""``evictedPods`` reason of a pod counted ahead of its eviction (:func:`reserve_evictions`)."""


def reserve_evictions(st: Status, evictions: Sequence[Eviction], now: datetime) -> Status:
    """The status to write before a round of evictions: each pod not counted yet counted as
    evicted (reason ``evicting``)."""
    evicted = list(st.evicted_pods)
    known = {p.uid for p in evicted}
    count = st.evicted_count
    for e in evictions:
        if e.pod.uid in known:
            continue
        known.add(e.pod.uid)
        count += 1
        if len(evicted) < MAX_LISTED_PODS:
            evicted.append(_record(e.pod, e.gang, EVICTING, "", now))
    return replace(st, evicted_pods=evicted, evicted_count=count)


def record_evictions(st: Status, results: list[EvictionResult], now: datetime) -> Status:
    """The round's results: an evicted pod counted once (reserved or not), a refused one given
    back to the count it was reserved in."""
    evicted = list(st.evicted_pods)
    known = {p.uid for p in evicted}
    count = st.evicted_count
    waiting = {p.uid: p for p in st.waiting_pods}
    errors = []
    for r in results:
        reserved = next((p for p in evicted if p.uid == r.pod.uid and p.reason == EVICTING), None)
        if r.outcome != "evicted" and reserved is not None:
            evicted.remove(reserved)
            known.discard(r.pod.uid)
            count -= 1
        if r.outcome == "evicted":
            waiting.pop(r.pod.uid, None)
            if reserved is not None:
                evicted[evicted.index(reserved)] = _record(r.pod, r.gang, "evicted", "", now)
            elif r.pod.uid not in known:
                known.add(r.pod.uid)
                count += 1
                if len(evicted) < MAX_LISTED_PODS:
                    evicted.append(_record(r.pod, r.gang, "evicted", "", now))
        elif r.outcome == "blocked":
            waiting[r.pod.uid] = _record(r.pod, r.gang, "pdb-blocked", r.message, now)
        elif r.outcome == "gone":
            waiting.pop(r.pod.uid, None)
        else:
            waiting[r.pod.uid] = _record(r.pod, r.gang, "error", r.message, now)
            errors.append(f"{r.pod.namespace}/{r.pod.name}: {r.message}")
    listed = sorted(waiting.values(), key=lambda p: (p.namespace, p.name))
    return replace(
        st,
        evicted_pods=evicted,
        evicted_count=count,
        waiting_pods=listed[:MAX_LISTED_PODS],
        waiting_count=max(st.waiting_count, len(listed)),
        last_error=clip("; ".join(errors)) if errors else st.last_error,
    )


def record_delivery(st: Status, order_id: str, delivered: bool, error: str = "") -> Status:
    if delivered:
        return mark_delivered(st, order_id)
    return replace(st, last_error=clip(f"order {order_id} not delivered: {error or 'no stream'}"))


def record_validation_pod(st: Status, name: str, uid: str | None) -> Status:
    """The UID the validation pod's create returned: the only pod of that name accepted.
    None (the name was taken): nothing recorded, so the pod there is never accepted."""
    v = st.validation
    if uid is None or v is None or v.pod_name != name:
        return st
    return replace(st, validation=msgspec.structs.replace(v, pod_uid=uid))


def record_error(st: Status, what: str, error: str) -> Status:
    return replace(st, last_error=clip(f"{what}: {error}"))


def blocked(st: Status, write: HardWrite, decision: GateDecision, now: datetime) -> Status:
    """The gate refused a disruptive step: the episode stays where it was, saying why."""
    message = f"{write.kind} refused: {decision.message or 'by the hard-write gate'}"
    return wait(st, now, decision.reason or "GateBlocked", message)


def record_replacement(
    st: Status, act: ReplaceNode, outcome: ReplaceOutcome, message: str, now: datetime
) -> tuple[Status, Note]:
    """What the delete of a node's NodeClaim (or Node) did, and the Event that says so. A
    target gone when the delete is sent again (``act.again``) was deleted by the pass that
    wrote ``Requested``."""
    r = st.replacement
    what = f"{NODECLAIM_KIND} {act.node_claim}" if act.method == "nodeclaim" else "the Node"
    if r is None:
        r = ReplacementStatus(state="Requested", method=act.method, pool=act.pool)
    if outcome == "deleted" or (outcome == "not-found" and act.again):
        text = f"{what} deleted: the node is being replaced ({act.method}, pool {act.pool})"
        state: ReplacementState = "Deleted"
        reason = "Deleted"
        note = Note("Normal", EVENT_NODE_REPLACEMENT_REQUESTED, text, node=True)
    else:
        reason = "TargetMismatch"
        if outcome == "not-found":
            reason = "NodeClaimNotFound" if act.method == "nodeclaim" else "NodeNotFound"
        text = f"not replaced: {message or what + ' ' + outcome}; nothing deleted"
        state = "Failed"
        note = Note("Warning", EVENT_NODE_REPLACEMENT_FAILED, text, node=True)
    r = msgspec.structs.replace(r, state=state, reason=reason, message=clip(text), at=now)
    return replace(st, replacement=r), note


def replacement_blocked(
    st: Status, write: HardWrite, decision: GateDecision, now: datetime
) -> Status:
    """The gate refused an escalated episode's replacement: it stays as it was, the refusal
    in its replacement's message (its ``reason`` says why it escalated, the RMA label's
    value)."""
    message = clip(f"{write.kind} refused: {decision.message or 'by the hard-write gate'}")
    r = st.replacement
    if r is None:
        return st
    return replace(st, replacement=msgspec.structs.replace(r, message=message), last_error=message)
