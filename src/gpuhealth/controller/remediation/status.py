"""How a step changes an episode's status, and what it asks the runner to do (pure).

- Actions are values (:class:`Quarantine`, :class:`Evict`, :class:`SendOrder` ...); the runner
  carries them out after the hard-write gate allowed the disruptive ones (:func:`hard_write`).
- The status helpers every phase uses: enter a phase, wait, be held, escalate, set a condition.
- The :class:`Context` of a step: holds (operator choices: the opt-out label, an action not
  enabled, dry-run) stop the disruptive steps and keep the phase's timeouts from firing; the
  loop's own waits (PDBs, approval, agent reports) keep their timeouts, which escalate.
- The life of one agent order inside the status: sent, maybe not delivered (no live stream:
  sent again after ``undelivered_retry_s``), reported on by the agent (``accepted``,
  ``running``, ``succeeded``, ``failed``, ``refused``), and sent again with the same id when
  no report came within its timeout (the agent answers a repeat with the result it has).
- Folding what the runner's actions did (evictions, deliveries, errors, gate refusals) back
  into the status.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from gpuhealth.controller.breaker.gate import HardWrite
from gpuhealth.controller.names import EVENT_REMEDIATION_ESCALATED, Keys
from gpuhealth.controller.remediation.drain import Eviction, plan_drain
from gpuhealth.controller.remediation.facts import NodeFacts, Observed, PodFacts
from gpuhealth.controller.remediation.fault import verify
from gpuhealth.controller.remediation.model import (
    MAX_LISTED_PODS,
    Episode,
    OrderStatus,
    Phase,
    PhaseTimes,
    PodRecord,
    Status,
    StatusCondition,
    ValidationStatus,
    clip,
)
from gpuhealth.controller.remediation.safety import (
    GateDecision,
    capability_gap,
    hold_reason,
)
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.protocol.remediation import (
    ActionReport,
    CancelOrder,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)

OrderKind = Literal["reset-gpu", "reboot", "validate", "cancel"]
WriteKind = Literal["quarantine", "evict", "force-delete", "reset-gpu", "reboot"]


UNNUMBERED = 0
"""The ``seq`` of an order a step builds: the stream numbers each order it sends on a
connection (``assembly.StreamOrders``), and stamps ``issued_at`` when it sends it."""

ORDER_KINDS: dict[type[Order], OrderKind] = {
    ResetGpuOrder: "reset-gpu",
    RebootOrder: "reboot",
    ValidateOrder: "validate",
    CancelOrder: "cancel",
}


@dataclass(frozen=True, slots=True)
class Quarantine:
    node: str


@dataclass(frozen=True, slots=True)
class Evict:
    eviction: Eviction


@dataclass(frozen=True, slots=True)
class ForceDelete:
    pod: PodFacts


@dataclass(frozen=True, slots=True)
class SendOrder:
    """A protocol order for the node's agent, built by the step (``seq`` :data:`UNNUMBERED`)."""

    order: Order

    @property
    def kind(self) -> OrderKind:
        return ORDER_KINDS[type(self.order)]


@dataclass(frozen=True, slots=True)
class CreateValidationPod:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class SetNodeLabel:
    node: str
    key: str
    value: str | None


Act = Quarantine | Evict | ForceDelete | SendOrder | CreateValidationPod | SetNodeLabel


@dataclass(frozen=True, slots=True)
class Note:
    """An Event to post about the episode (and, with ``node``, about its Node too)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    node: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    status: Status
    actions: tuple[Act, ...] = ()
    notes: tuple[Note, ...] = ()
    requeue_after_s: float | None = None
    transitions: tuple[tuple[Phase, Phase], ...] = field(default=())


def hard_write(act: Act) -> WriteKind | None:
    """The kind of disruptive write an action is (None: not disruptive)."""
    if isinstance(act, Quarantine):
        return "quarantine"
    if isinstance(act, Evict):
        return "evict"
    if isinstance(act, ForceDelete):
        return "force-delete"
    if isinstance(act, SendOrder) and act.kind in ("reset-gpu", "reboot"):
        return act.kind
    return None


def _landing(act: Act, node: str) -> str:
    if isinstance(act, Evict):
        return act.eviction.pod.node or node
    if isinstance(act, ForceDelete):
        return act.pod.node or node
    return node


def hard_writes(ep: Episode, actions: Sequence[Act]) -> list[HardWrite]:
    """One gate request per (kind, node) the step's disruptive actions land on: the
    episode's node first, then the other nodes (gang members) by name."""
    count: dict[tuple[WriteKind, str], int] = {}
    for act in actions:
        kind = hard_write(act)
        if kind is not None:
            key = (kind, _landing(act, ep.node))
            count[key] = count.get(key, 0) + 1
    keys = sorted(count, key=lambda k: (k[1] != ep.node, k[1], k[0]))
    return [
        HardWrite(node=node, kind=kind, episode=ep.name, detail=f"{count[kind, node]} action(s)")
        for kind, node in keys
    ]


def held_reason(st: Status) -> str:
    """The reason of the episode's ``Held`` condition ("" when it is not held)."""
    return next((c.reason for c in st.conditions if c.type == "Held" and c.status == "True"), "")


def order_id(fingerprint: str, kind: str, attempt: int) -> str:
    return f"{fingerprint}-{kind}-{attempt}"


def kebab(reason: str) -> str:
    """``DrainTimeout`` -> ``drain-timeout`` (a label value)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", reason).lower()[:63].strip("-") or "escalated"


# -- status helpers (every function returns a new Status) -------------------------------


def _times(times: PhaseTimes, **changes: datetime | None) -> PhaseTimes:
    return msgspec.structs.replace(times, **changes)


def replace(st: Status, **changes: object) -> Status:
    return msgspec.structs.replace(st, **changes)


def enter(
    st: Status, phase: Phase, now: datetime, reason: str, message: str = "", **marks: datetime
) -> Status:
    """Move to ``phase``: its timestamp, the reason, and any stage marks (``drained=now``).
    Entering Returned marks ``validated``; ``returned`` is set when the quarantine is gone."""
    mark = "validated" if phase is Phase.RETURNED else phase.value.lower()
    times = _times(st.times, **{mark: now, **marks})
    conditions = set_condition(
        st.conditions, "Progressing", status="True", reason=reason, message=message, now=now
    )
    conditions = drop_condition(conditions, "Held")
    return replace(
        st, phase=phase, times=times, reason=reason, message=clip(message), conditions=conditions
    )


def wait(st: Status, now: datetime, reason: str, message: str = "") -> Status:
    """Stay in the phase, saying what the episode waits for."""
    conditions = set_condition(
        st.conditions, "Progressing", status="False", reason=reason, message=message, now=now
    )
    conditions = drop_condition(conditions, "Held")
    return replace(st, reason=reason, message=clip(message), conditions=conditions)


def held(st: Status, now: datetime, reason: str, message: str = "") -> Status:
    """Stay, held by an operator's choice (opt-out label, action disabled, dry-run)."""
    conditions = set_condition(
        st.conditions, "Held", status="True", reason=reason, message=message, now=now
    )
    conditions = set_condition(
        conditions, "Progressing", status="False", reason=reason, message=message, now=now
    )
    return replace(st, reason=reason, message=clip(message), conditions=conditions)


def set_condition(
    conditions: list[StatusCondition],
    type_: str,
    *,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: datetime,
) -> list[StatusCondition]:
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = StatusCondition(
        type=type_,
        status=status,
        reason=reason,
        message=clip(message),
        last_transition_time=since,
    )
    return [c for c in conditions if c.type != type_] + [new]


def drop_condition(conditions: list[StatusCondition], type_: str) -> list[StatusCondition]:
    return [c for c in conditions if c.type != type_]


DONE_STATES = frozenset({"succeeded", "failed", "refused"})


def current_order(st: Status, kind: str) -> OrderStatus | None:
    return st.order if st.order is not None and st.order.action == kind else None


def absorb_report(order: OrderStatus | None, report: ActionReport | None) -> OrderStatus | None:
    """The order with the agent's latest word on it (older or foreign reports ignored)."""
    if order is None or report is None or report.order_id != order.id:
        return order
    if order.reported_at is not None and report.at < order.reported_at:
        return order
    if order.state in DONE_STATES and report.state not in DONE_STATES:
        return order  # a late "running" never undoes a result
    return msgspec.structs.replace(
        order,
        state=report.state,
        reason=report.reason,
        message=clip(report.message),
        reported_at=report.at,
        delivered=True,
    )


def new_order(fingerprint: str, kind: str, attempt: int, now: datetime) -> OrderStatus:
    return OrderStatus(
        id=order_id(fingerprint, kind, attempt), action=kind, attempt=attempt, sent_at=now
    )


def resend_due(
    order: OrderStatus, now: datetime, timeout_s: float, undelivered_s: float
) -> float | None:
    """0 when the same order should go out again now, else seconds until it may (None:
    never, it has a result)."""
    if order.state in DONE_STATES:
        return None
    sent = order.sent_at or now
    wait_s = timeout_s if order.delivered else min(undelivered_s, timeout_s)
    due = sent + timedelta(seconds=wait_s)
    return max(0.0, (due - now).total_seconds())


def resent(order: OrderStatus, now: datetime) -> OrderStatus:
    return msgspec.structs.replace(order, sent_at=now, delivered=False)


def mark_delivered(st: Status, order_id_: str) -> Status:
    """Record that the order reached a live agent stream."""
    order = st.order
    if order is None or order.id != order_id_ or order.delivered:
        return st
    return msgspec.structs.replace(st, order=msgspec.structs.replace(order, delivered=True))


@dataclass(frozen=True, slots=True)
class Context:
    settings: RemediationSettings
    keys: Keys
    history: tuple[Episode, ...] = ()
    """The node's other episodes (for :func:`fault.verify`)."""


def seconds_until(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (at - now).total_seconds())


def earliest(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def deadline(start: datetime | None, seconds: float, now: datetime) -> datetime:
    return (start or now) + timedelta(seconds=seconds)


def escalate(
    st: Status, now: datetime, reason: str, message: str, *, node: str, cx: Context
) -> Step:
    """Escalated: the RMA label on the node (its value says why), a Warning Event."""
    label = SetNodeLabel(node, cx.keys.rma_label, kebab(reason))
    return Step(
        enter(st, Phase.ESCALATED, now, reason, message),
        actions=(label,),
        notes=(Note("Warning", EVENT_REMEDIATION_ESCALATED, f"{reason}: {message}", node=True),),
    )


def capability_step(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step | None:
    """Before anything disruptive: the node's agent can carry the episode out. An agent that
    cannot escalates the episode (``NoExecutor``); one that does not say waits
    (``CapabilitiesUnknown``). None: it can."""
    gap = capability_gap(ep, node, cx.settings)
    if gap is None:
        return None
    known, message = gap
    if known:
        return escalate(ep.status, obs.now, "NoExecutor", message, node=node.name, cx=cx)
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


def record_evictions(st: Status, results: list[EvictionResult], now: datetime) -> Status:
    evicted = list(st.evicted_pods)
    known = {p.uid for p in evicted}
    count = st.evicted_count
    waiting = {p.uid: p for p in st.waiting_pods}
    errors = []
    for r in results:
        if r.outcome == "evicted":
            waiting.pop(r.pod.uid, None)
            if r.pod.uid not in known:
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


def record_error(st: Status, what: str, error: str) -> Status:
    return replace(st, last_error=clip(f"{what}: {error}"))


def blocked(st: Status, write: HardWrite, decision: GateDecision, now: datetime) -> Status:
    """The gate refused a disruptive step: the episode stays where it was, saying why."""
    message = f"{write.kind} refused: {decision.message or 'by the hard-write gate'}"
    return wait(st, now, decision.reason or "GateBlocked", message)
