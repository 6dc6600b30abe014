"""Escalating an episode (pure): Escalated, the RMA label on the node (its value says why, a
label value made from the reason) and a Warning Event.

``NoExecutor`` (the node's agent cannot carry the action out: its settings, not its GPUs) puts
no RMA label: an agent-wide misconfiguration would otherwise send every faulty node's
hardware to RMA. Such escalations count against ``safety.max_unresolved_escalations`` like
every other, and the incidents' capability watch makes them one incident
(``gpuhealth.controller.incidents.capabilities``)."""

from __future__ import annotations

import re
from datetime import datetime

from gpuhealth.controller.names import EVENT_REMEDIATION_ESCALATED
from gpuhealth.controller.remediation.actions import SetNodeLabel
from gpuhealth.controller.remediation.model import Phase, Status
from gpuhealth.controller.remediation.status import enter
from gpuhealth.controller.remediation.step import Context, Note, Step


def kebab(reason: str) -> str:
    """``DrainTimeout`` -> ``drain-timeout`` (a label value)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", reason).lower()[:63].strip("-") or "escalated"


NO_EXECUTOR = "NoExecutor"
NOT_THE_HARDWARE = frozenset({NO_EXECUTOR})
"""Escalation reasons that say nothing about the node's hardware: no RMA label."""


def rma_value(reason: str) -> str | None:
    """The RMA label an escalation for ``reason`` puts on its node (None: none)."""
    return None if reason in NOT_THE_HARDWARE else kebab(reason)


def escalate(
    st: Status, now: datetime, reason: str, message: str, *, node: str, cx: Context
) -> Step:
    """Escalated: the RMA label on the node (its value says why; none for
    :data:`NOT_THE_HARDWARE`), a Warning Event."""
    rma = rma_value(reason)
    return Step(
        enter(st, Phase.ESCALATED, now, reason, message),
        actions=() if rma is None else (SetNodeLabel(node, cx.keys.rma_label, rma),),
        notes=(Note("Warning", EVENT_REMEDIATION_ESCALATED, f"{reason}: {message}", node=True),),
    )
