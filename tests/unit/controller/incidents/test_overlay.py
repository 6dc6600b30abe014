"""The controller's word over the agent's, and what the remediation loop makes of a blame."""

from __future__ import annotations

import pytest

from gpuhealth.controller.incidents.overlay import BLAME_CODE, blame_condition, overlay
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.fault import propose
from gpuhealth.controller.remediation.model import Episode, initial_status
from gpuhealth.controller.remediation.validating import wants_diagnostic
from gpuhealth.protocol import Condition
from tests.fakes.remediation_world import T0, node_facts
from tests.support.remediation import settings

REPEATED = Condition(reason="XidRepeated", code="xid-repeated", severity="degraded")
HOT = Condition(reason="Thermal", code="thermal", severity="degraded")
LOST = Condition(reason="GpuLost", code="gpu-lost", severity="unhealthy")
LOST_RESET = Condition(
    reason="XidError", code="xid-79", severity="unhealthy", action="RESET_GPU", since=T0
)
BLAME = blame_condition("XID 31 under 3 jobs", T0, 31)


@pytest.mark.parametrize(
    ("state", "conds", "drop", "blame", "want_state", "want_codes"),
    [
        ("degraded", [REPEATED], True, None, "healthy", []),
        ("degraded", [REPEATED], False, None, "degraded", ["xid-repeated"]),
        ("degraded", [REPEATED, HOT], True, None, "degraded", ["thermal"]),
        ("unhealthy", [REPEATED, LOST], True, None, "unhealthy", ["gpu-lost"]),
        ("unknown", [REPEATED], True, None, "unknown", []),
        ("healthy", [], True, BLAME, "unhealthy", [BLAME_CODE]),
        ("degraded", [REPEATED], True, BLAME, "unhealthy", [BLAME_CODE]),
        ("healthy", [BLAME], True, None, "healthy", []),  # a stale blame never sticks
    ],
)
def test_overlay(
    state: str,
    conds: list[Condition],
    drop: bool,
    blame: Condition | None,
    want_state: str,
    want_codes: list[str],
) -> None:
    got_state, got = overlay(state, conds, drop_agent_escalation=drop, blame=blame)  # type: ignore[arg-type]
    assert got_state == want_state and [c.code for c in got] == want_codes


def test_a_blamed_gpu_is_reset_and_validated_with_the_diagnostic() -> None:
    node = node_facts(unhealthy={0: BLAME})
    proposal = propose(node, [], settings(enabled=True), Keys("gpuhealth.io"), T0)
    assert proposal.spec is not None and proposal.spec.action == "reset-gpu"
    assert [g.code for g in proposal.spec.fault.gpus] == [BLAME_CODE]
    ep = Episode(name=proposal.name, spec=proposal.spec, status=initial_status(T0))
    assert wants_diagnostic(ep)
    other = node_facts(unhealthy={0: LOST_RESET})
    plain = propose(other, [], settings(enabled=True), Keys("gpuhealth.io"), T0)
    assert plain.spec is not None
    assert not wants_diagnostic(Episode(name="x", spec=plain.spec, status=initial_status(T0)))
