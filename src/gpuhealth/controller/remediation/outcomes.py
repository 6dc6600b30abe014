"""What the runner's actions did, folded back into the episode's status (pure): evictions
(evicted, blocked by a PodDisruptionBudget, gone, failed), deliveries of orders, validation
pods created, errors, and the hard-write gate's refusals.

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
from gpuhealth.controller.remediation.drain import Eviction
from gpuhealth.controller.remediation.facts import PodFacts
from gpuhealth.controller.remediation.model import MAX_LISTED_PODS, PodRecord, Status, clip
from gpuhealth.controller.remediation.orders import mark_delivered
from gpuhealth.controller.remediation.status import replace, wait

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
