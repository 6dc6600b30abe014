"""Escalating an episode (pure): Escalated, the RMA label on the node (its value says why, a
label value made from the reason) and a Warning Event."""

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
