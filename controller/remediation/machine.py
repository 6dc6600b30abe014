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
re-validates it. The phases: :mod:`prepare` (Pending, Quarantined, Draining), :mod:`act`
(Remediating), :mod:`validation` (Validating), :mod:`finish` (the end states).
"""

from __future__ import annotations

from gpuhealth.controller.remediation.act import remediating
from gpuhealth.controller.remediation.actions import Note, OrderRequest, SendOrder, Step, enter
from gpuhealth.controller.remediation.context import Context
from gpuhealth.controller.remediation.facts import Observed
from gpuhealth.controller.remediation.finish import terminal
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.remediation.prepare import draining, pending, quarantined
from gpuhealth.controller.remediation.validation import validating

__all__ = ["Context", "step"]


def step(ep: Episode, obs: Observed, cx: Context) -> Step:
    st = ep.status
    now = obs.now
    if ep.terminal:
        result = terminal(ep, obs, cx)
    elif (reason := ep.annotations.get(cx.keys.abort)) is not None:
        result = _abort(ep, reason or "aborted by an operator", obs, cx)
    elif obs.node is None:
        result = Step(
            enter(st, Phase.FAILED, now, "NodeGone", "the Node object was deleted"),
            notes=(Note("Warning", "NodeGone", "the Node was deleted; episode ended"),),
        )
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


def _abort(ep: Episode, reason: str, obs: Observed, cx: Context) -> Step:
    st = ep.status
    actions: tuple[SendOrder, ...] = ()
    order = st.order
    if (
        order is not None
        and order.action == "validate"
        and order.state in ("", "accepted", "running")
    ):
        actions = (
            SendOrder(
                OrderRequest(
                    kind="cancel",
                    order_id=f"{order.id}-cancel",
                    deadline_s=cx.settings.reset_gpu.order_timeout_s,
                    cancel_order_id=order.id,
                )
            ),
        )
    message = f"aborted by an operator ({cx.keys.abort}): {reason}"
    return Step(
        enter(st, Phase.FAILED, obs.now, "Aborted", message),
        actions=actions,
        notes=(Note("Warning", "RemediationAborted", message, node=True),),
    )
