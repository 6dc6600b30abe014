"""The controller's word over the agent's, and what the remediation loop makes of a blame."""

from __future__ import annotations

import pytest

from gpuhealth.controller.incidents.overlay import (
    BLAME_CODE,
    JUDGED_NOTE,
    SUSPECT_CODE,
    blame_condition,
    overlay,
)
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


SUSPECT = blame_condition("first in 2 attempts of ml/JobSet/train", T0, 31, suspected=True)


@pytest.mark.parametrize(
    ("state", "conds", "demote", "blame", "want_state", "want"),
    [
        # the agent's verdict kept as information (healthy), the node no longer degraded by it
        ("degraded", [REPEATED], True, None, "healthy", [("xid-repeated", "healthy")]),
        ("degraded", [REPEATED], False, None, "degraded", [("xid-repeated", "degraded")]),
        (
            "degraded",
            [REPEATED, HOT],
            True,
            None,
            "degraded",
            [("xid-repeated", "healthy"), ("thermal", "degraded")],
        ),
        (
            "unhealthy",
            [REPEATED, LOST],
            True,
            None,
            "unhealthy",
            [("xid-repeated", "healthy"), ("gpu-lost", "unhealthy")],
        ),
        ("unknown", [REPEATED], True, None, "unknown", [("xid-repeated", "healthy")]),
        ("healthy", [], True, BLAME, "unhealthy", [(BLAME_CODE, "unhealthy")]),
        (
            "degraded",
            [REPEATED],
            True,
            BLAME,
            "unhealthy",
            [("xid-repeated", "healthy"), (BLAME_CODE, "unhealthy")],
        ),
        ("healthy", [BLAME], True, None, "healthy", []),  # a stale blame never sticks
        ("healthy", [SUSPECT], True, None, "healthy", []),
        ("healthy", [], True, SUSPECT, "degraded", [(SUSPECT_CODE, "degraded")]),
        (
            "unhealthy",
            [LOST],
            True,
            SUSPECT,
            "unhealthy",
            [("gpu-lost", "unhealthy"), (SUSPECT_CODE, "degraded")],
        ),
    ],
)
def test_overlay(
    state: str,
    conds: list[Condition],
    demote: bool,
    blame: Condition | None,
    want_state: str,
    want: list[tuple[str, str]],
) -> None:
    got_state, got = overlay(state, conds, demote_agent_escalation=demote, blame=blame)  # type: ignore[arg-type]
    assert got_state == want_state and [(c.code, c.severity) for c in got] == want
    demoted = [c for c in got if c.code == "xid-repeated" and c.severity == "healthy"]
    assert all(c.action == "NONE" and c.message.startswith(JUDGED_NOTE) for c in demoted)


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
