"""Returned, Escalated, Failed: what a finished episode still keeps true.

- Returned: the RMA label is removed if an earlier escalation left it (and no other episode
  of the node is Escalated); ``times.returned``
  is set once the quarantine taint is seen gone (the stage "validated -> returned").
- Escalated: the node keeps its quarantine and carries ``<prefix>/rma=<reason>``, decided
  once when it escalated (a label that went missing is put back, a different value is never
  fought over: the label is written once, not on every pass); no new episode starts on the
  node until an operator resolves the escalation (``fault.propose``).
- Escalated or Failed after quarantine: an operator's ``<prefix>/release`` annotation (a
  value not handled before) re-validates the node; a pass returns it, a failure escalates
  again.
  Deleting the GPURemediation forgets the episode (and lifts its quarantine); if the fault
  is still there a new episode starts for it.
- Failed by an abort while an order was in flight: its cancel is sent again until the agent
  acknowledges it (a report on the cancel), for as long as the order could still run
  (:func:`cancel_window_s`).
"""

from __future__ import annotations

import msgspec

from gpuhealth.controller.names import EVENT_REMEDIATION_RELEASED
from gpuhealth.controller.remediation.actions import Act, SendOrder, SetNodeLabel
from gpuhealth.controller.remediation.deadlines import deadline, earliest, seconds_until
from gpuhealth.controller.remediation.escalation import rma_value
from gpuhealth.controller.remediation.facts import Observed
from gpuhealth.controller.remediation.model import (
    Episode,
    Phase,
    ValidationStatus,
    handled_release,
    released_again,
)
from gpuhealth.controller.remediation.orders import (
    DONE_STATES,
    absorb_report,
    cancel_order,
    current_order,
    resend_due,
    resent,
)
from gpuhealth.controller.remediation.status import enter, replace
from gpuhealth.controller.remediation.step import Context, Note, Step
from gpuhealth.controller.remediation.taint import holds_quarantine


def terminal(ep: Episode, obs: Observed, cx: Context) -> Step:
    st, now, node = ep.status, obs.now, obs.node
    release = released_again(ep.annotations, cx.keys.release_annotation, st)
    if (
        holds_quarantine(ep)
        and st.phase in (Phase.ESCALATED, Phase.FAILED)
        and release
        and node is not None
    ):
        attempt = st.validation.attempt + 1 if st.validation is not None else 1
        st = replace(
            st,
            release_handled=handled_release(release),
            validation=ValidationStatus(attempt=attempt, started_at=now),
            order=None,
        )
        message = f"released by an operator ({release}); validating before return"
        return Step(
            enter(st, Phase.VALIDATING, now, "Released", message),
            notes=(Note("Normal", EVENT_REMEDIATION_RELEASED, message, node=True),),
        )
    if node is None:
        return Step(st)
    if st.phase is Phase.FAILED and current_order(st, "cancel") is not None:
        return follow_cancel(ep, obs, cx)
    actions: list[Act] = []
    rma = node.labels.get(cx.keys.rma_label)
    if st.phase is Phase.ESCALATED:
        value = rma_value(st.reason)
        if rma is None and value is not None:  # decided once: only a missing one is put back
            actions.append(SetNodeLabel(node.name, cx.keys.rma_label, value))
        return Step(st, tuple(actions))
    if st.phase is Phase.RETURNED and st.times.returned is None:
        escalated = any(h.phase is Phase.ESCALATED for h in cx.history)
        if rma is not None and not escalated:
            actions.append(SetNodeLabel(node.name, cx.keys.rma_label, None))
        if node.has_taint(cx.keys.quarantine_taint):
            return Step(st, tuple(actions), requeue_after_s=cx.settings.quarantine_check_s)
        st = replace(st, times=msgspec.structs.replace(st.times, returned=now))
        note = Note(
            "Normal", "NodeReturned", "quarantine lifted; the node takes work again", node=True
        )
        return Step(st, tuple(actions), notes=(note,))
    return Step(st, tuple(actions))


def cancel_window_s(cx: Context) -> float:
    """How long after an abort an order it cancelled could still run on the agent (the
    longest order deadline): the cancel is sent again within it, not after."""
    s = cx.settings
    validate = s.validation.soak_s + s.validation.report_grace_s
    return max(s.reset_gpu.order_timeout_s, s.reboot.order_timeout_s, validate)


def follow_cancel(ep: Episode, obs: Observed, cx: Context) -> Step:
    """The cancel of an aborted episode's order: absorbed when the agent reports on it, sent
    again (the same id: the agent answers a repeat from its journal) while unanswered."""
    st, now = ep.status, obs.now
    cancel = absorb_report(current_order(st, "cancel"), obs.report)
    assert cancel is not None
    st = replace(st, order=cancel)
    end = deadline(st.times.failed, cancel_window_s(cx), now)
    if cancel.state in DONE_STATES or now >= end:
        return Step(st)
    retry = cx.settings.undelivered_retry_s
    due = resend_due(cancel, now, retry, retry)
    actions: tuple[Act, ...] = ()
    if due == 0.0:
        cancel = resent(cancel, now)
        st = replace(st, order=cancel)
        actions = (SendOrder(cancel_order(cancel, ep.name, now)),)
    return Step(st, actions, requeue_after_s=earliest(due or retry, seconds_until(end, now)))
