"""The controller's word over the agent's on application-class XIDs (pure).

With the fleet-level judge on, two things change what a GPU's health says before the fleet
keeps it: the agent's ``xid-repeated`` verdict (repeats of an application XID on one GPU,
whatever ran there) is dropped, since the controller, seeing the jobs, decides; and a GPU the
controller blamed carries ``gpu-blamed`` (unhealthy, RUN_DIAGNOSTICS) whatever the agent says.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuhealth.protocol import Condition, severity, worst_state
from gpuhealth.protocol.v1 import HealthState

AGENT_ESCALATION_CODE = "xid-repeated"
BLAME_CODE = "gpu-blamed"
BLAME_REASON = "GpuBlamed"
BLAME_ACTION = "RUN_DIAGNOSTICS"


def blame_condition(message: str, since: datetime, xid: int | None) -> Condition:
    return Condition(
        reason=BLAME_REASON,
        code=BLAME_CODE,
        severity="unhealthy",
        message=message[:1024],
        action=BLAME_ACTION,
        xid=xid,
        since=since,
    )


def overlay(
    state: HealthState,
    conditions: Sequence[Condition],
    *,
    drop_agent_escalation: bool,
    blame: Condition | None,
) -> tuple[HealthState, list[Condition]]:
    """The GPU's state and conditions as the fleet should keep them."""
    kept = [
        c
        for c in conditions
        if c.code != BLAME_CODE and not (drop_agent_escalation and c.code == AGENT_ESCALATION_CODE)
    ]
    if len(kept) != len(conditions) and state == "degraded":
        # The dropped verdict may have been the only reason for ``degraded``.
        recomputed = worst_state((c.severity for c in kept), default="healthy")
        state = recomputed if severity(recomputed) <= severity(state) else state
    if blame is not None:
        kept.append(blame)
        state = "unhealthy"
    return state, kept
