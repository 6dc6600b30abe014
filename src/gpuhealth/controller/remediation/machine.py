"""The episode state machine (pure, level-triggered).

``step(episode, observed, context)`` -> the next status and the actions to take. It reads
only the stored status and what is observed now, so a controller restart or a leader
change resumes from the status alone, and running a step twice asks for the same
(idempotent) actions: order ids derive from the status, evictions of pods already gone or
terminating are not repeated, a reboot order names the boot it may interrupt.

Pending -> Quarantined -> Draining -> Remediating -> Validating -> Returned; Failed
(aborted, node gone, fault cleared before admission, spec mismatch) and Escalated (the
verdict says contact support, repeated faults, timeouts, refused or failed actions,
failed validation) keep the node quarantined until an operator releases it, which
re-validates it. One module per phase: :mod:`pending`, :mod:`quarantined`, :mod:`draining`,
:mod:`remediating`, :mod:`validating`, :mod:`finished` (the end states).
"""

from __future__ import annotations

from gpuhealth.controller.names import EVENT_REMEDIATION_ABORTED, EXCLUDE_VALUE
from gpuhealth.controller.remediation.actions import SendOrder
from gpuhealth.controller.remediation.draining import draining
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.finished import terminal
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.remediation.orders import cancel_of, cancel_order, in_flight
from gpuhealth.controller.remediation.pending import pending
from gpuhealth.controller.remediation.quarantined import quarantined
from gpuhealth.controller.remediation.remediating import remediating
from gpuhealth.controller.remediation.status import enter, replace
from gpuhealth.controller.remediation.step import Context, Note, Step
from gpuhealth.controller.remediation.taint import EXCLUDED, QUARANTINE_REMOVED
from gpuhealth.controller.remediation.validating import validating

__all__ = ["Context", "quarantine_lost", "step"]

PAST_QUARANTINE = frozenset({Phase.DRAINING, Phase.REMEDIATING, Phase.VALIDATING})
"""Phases entered only once the quarantine taint was seen on the node."""


def step(ep: Episode, obs: Observed, cx: Context) -> Step:
    st = ep.status
    now = obs.now
    if ep.terminal:
        result = terminal(ep, obs, cx)
    elif (reason := ep.annotations.get(cx.keys.abort_annotation)) is not None:
        why = reason or "aborted by an operator"
        message = f"aborted by an operator ({cx.keys.abort_annotation}): {why}"
        result = _abort(ep, "Aborted", message, obs, cx)
    elif obs.node is None:
        result = Step(
            enter(st, Phase.FAILED, now, "NodeGone", "the Node object was deleted"),
            notes=(Note("Warning", "NodeGone", "the Node was deleted; episode ended"),),
        )
    elif (lost := quarantine_lost(ep, obs.node, cx)) is not None:
        result = _abort(ep, *lost, obs, cx)
    else:
        handler = {
            Phase.PENDING: pending,
            Phase.QUARANTINED: quarantined,
            Phase.DRAINING: draining,
            Phase.REMEDIATING: remediating,
            Phase.VALIDATING: validating,
        }[st.phase]
        result = handler(ep, obs.node, obs, cx)
    if result.status.phase != st.phase:
        result = Step(
            result.status,
            result.actions,
            result.notes,
            0.0 if result.requeue_after_s is None else result.requeue_after_s,
            ((st.phase, result.status.phase),),
        )
    return result


def quarantine_lost(ep: Episode, node: NodeFacts, cx: Context) -> tuple[str, str] | None:
    """Has an operator taken the node's quarantine away? Excluding the node, or removing the
    quarantine taint by hand (gone while the episode held it, or acknowledged by the
    reconciler, an override incident, before the episode saw it): (reason, message), else
    None."""
    keys = cx.keys
    if node.labels.get(keys.exclude_label) == EXCLUDE_VALUE:
        return (
            EXCLUDED,
            f"the node is labelled {keys.exclude_label}={EXCLUDE_VALUE}; episode aborted",
        )
    removed = f"the {keys.quarantine_taint} taint was removed by hand; episode aborted"
    if ep.phase in PAST_QUARANTINE and not node.has_taint(keys.quarantine_taint):
        return (QUARANTINE_REMOVED, removed)
    ours = (keys.quarantine_taint, ep.spec.action)
    if ep.phase is Phase.QUARANTINED and any((t.key, t.value) == ours for t in node.acknowledged):
        return (QUARANTINE_REMOVED, removed)
    return None


def _abort(ep: Episode, reason: str, message: str, obs: Observed, cx: Context) -> Step:
    """Failed: nothing disruptive after this. An order still in flight (a GPU reset, a
    reboot in its delay, a validation) is cancelled: the status then follows the cancel until
    the agent acknowledges it (``finished.terminal``)."""
    st = ep.status
    actions: tuple[SendOrder, ...] = ()
    if in_flight(st.order):
        assert st.order is not None
        cancel = cancel_of(st.order, obs.now)
        st = replace(st, order=cancel)
        actions = (SendOrder(cancel_order(cancel, ep.name, obs.now)),)
    return Step(
        enter(st, Phase.FAILED, obs.now, reason, message),
        actions=actions,
        notes=(Note("Warning", EVENT_REMEDIATION_ABORTED, message, node=True),),
        requeue_after_s=cx.settings.undelivered_retry_s if actions else None,
    )
