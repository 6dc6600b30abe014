"""The controller's word over the agent's on application-class XIDs (pure).

With the fleet-level judge on, two things change what a GPU's health says before the fleet
keeps it: the agent's ``xid-repeated`` verdict (repeats of an application XID on one GPU,
whatever ran there) is kept as information only (severity healthy, no action) while the
controller sees the node's jobs and decides; and a GPU the controller blamed carries
``gpu-blamed`` (unhealthy, RUN_DIAGNOSTICS), one it suspects ``gpu-suspected`` (degraded, no
action: the soft taint), whatever the agent says.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from gpuhealth.protocol import Condition, severity, worst_state
from gpuhealth.protocol.v1 import HealthState

AGENT_ESCALATION_CODE = "xid-repeated"
BLAME_CODE = "gpu-blamed"
BLAME_REASON = "GpuBlamed"
BLAME_ACTION = "RUN_DIAGNOSTICS"
SUSPECT_CODE = "gpu-suspected"
SUSPECT_REASON = "GpuSuspected"
OURS = frozenset({BLAME_CODE, SUSPECT_CODE})
JUDGED_NOTE = "judged by the controller with the node's jobs: "
"""The start of a demoted ``xid-repeated`` condition's message."""


def blame_condition(
    message: str, since: datetime, xid: int | None, *, suspected: bool = False
) -> Condition:
    """``gpu-blamed`` (unhealthy, the diagnostic), or ``gpu-suspected`` (degraded, no
    action)."""
    return Condition(
        reason=SUSPECT_REASON if suspected else BLAME_REASON,
        code=SUSPECT_CODE if suspected else BLAME_CODE,
        severity="degraded" if suspected else "unhealthy",
        message=message[:1024],
        action="NONE" if suspected else BLAME_ACTION,
        xid=xid,
        since=since,
    )


def overlay(
    state: HealthState,
    conditions: Sequence[Condition],
    *,
    demote_agent_escalation: bool,
    blame: Condition | None,
) -> tuple[HealthState, list[Condition]]:
    """The GPU's state and conditions as the fleet should keep them."""
    kept: list[Condition] = []
    changed = False
    for c in conditions:
        if c.code in OURS:
            changed = True
            continue
        if demote_agent_escalation and c.code == AGENT_ESCALATION_CODE and c.severity != "healthy":
            kept.append(_demoted(c))
            changed = True
        else:
            kept.append(c)
    if changed and state == "degraded":
        # The demoted verdict may have been the only reason for ``degraded``.
        recomputed = worst_state((c.severity for c in kept), default="healthy")
        state = recomputed if severity(recomputed) <= severity(state) else state
    if blame is not None:
        kept.append(blame)
        state = worst_state((state, blame.severity))
    return state, kept


def _demoted(c: Condition) -> Condition:
    """The agent's verdict as information: shown, never degrading or acting by itself."""
    return msgspec.structs.replace(
        c, severity="healthy", action="NONE", message=(JUDGED_NOTE + c.message)[:1024]
    )
