"""The driver's recovery action and NVML_ERROR_RESET_REQUIRED as verdicts (table-driven)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuhealth.agent.observations import RecoveryActionObservation, ResetObservation
from tests.unit.agent.health.test_engine import U0, Step, World


def event(value: int) -> Step:
    def step(w: World) -> None:
        w.transitions += w.engine.observe(
            RecoveryActionObservation(source="nvml", uuid=U0, at=w.clock.now(), value=value)
        )

    return step


def samples(n: int, **kw: object) -> Step:
    return lambda w: w.samples(n, **kw)


def reset(w: World) -> None:
    w.transitions += w.engine.observe(
        ResetObservation(source="nvml", at=w.clock.now(), uuid=U0, reason="reset")
    )


@dataclass
class Row:
    name: str
    steps: list[Step]
    state: str
    codes: set[str]
    action: str | None = None


ROWS = [
    Row("field none is healthy", [samples(5, recovery_action=0)], "healthy", set()),
    Row(
        "field gpu reset after the flag confirmation",
        [samples(2, recovery_action=1)],
        "unhealthy",
        {"recovery-gpu-reset"},
        "RESET_GPU",
    ),
    Row(
        "one field sample is not enough",
        [samples(1, recovery_action=1)],
        "healthy",
        set(),
    ),
    Row(
        "bad, clean, bad: never two in a row, never raised (the gated group keeps its streak)",
        [
            samples(1, recovery_action=1),
            samples(1, recovery_action=0),
            samples(1, recovery_action=1),
        ],
        "healthy",
        set(),
    ),
    Row(
        "field node reboot",
        [samples(2, recovery_action=2)],
        "unhealthy",
        {"recovery-node-reboot"},
        "RESTART_BM",
    ),
    Row(
        "field drain p2p is degraded",
        [samples(2, recovery_action=3)],
        "degraded",
        {"recovery-drain-p2p"},
        "DRAIN_P2P",
    ),
    Row(
        "field drain and reset",
        [samples(2, recovery_action=4)],
        "unhealthy",
        {"recovery-drain-and-reset"},
        "RESET_GPU",
    ),
    Row(
        "field IMEX domain is degraded",
        [samples(2, recovery_action=5)],
        "degraded",
        {"recovery-recover-imex-domain"},
        "RECOVER_IMEX_DOMAIN",
    ),
    Row(
        "field value newer than the table",
        [samples(2, recovery_action=42)],
        "degraded",
        {"recovery-unknown"},
        "CONTACT_SUPPORT",
    ),
    Row(
        "event raises at once",
        [event(2)],
        "unhealthy",
        {"recovery-node-reboot"},
        "RESTART_BM",
    ),
    Row("event none raises nothing", [event(0)], "healthy", set()),
    Row(
        "event then field back to none clears after the confirmation",
        [event(1), samples(2, recovery_action=0)],
        "healthy",
        set(),
    ),
    Row(
        "event then field still set holds",
        [event(1), samples(10, recovery_action=1)],
        "unhealthy",
        {"recovery-gpu-reset"},
    ),
    Row(
        "field changes action: the old one clears, the new one raises",
        [samples(2, recovery_action=3), samples(2, recovery_action=2)],
        "unhealthy",
        {"recovery-node-reboot"},
    ),
    Row(
        "a GPU reset clears a reset verdict",
        [event(1), reset],
        "healthy",
        set(),
    ),
    Row(
        "RESET_REQUIRED",
        [samples(2, reset_required=True)],
        "unhealthy",
        {"reset-required"},
        "RESET_GPU",
    ),
    Row(
        "RESET_REQUIRED gone after a reset",
        [samples(2, reset_required=True), reset, samples(3, reset_required=False)],
        "healthy",
        set(),
    ),
    Row(
        "a source without the field says nothing",
        [samples(5, recovery_action=None, reset_required=None)],
        "healthy",
        set(),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_recovery(row: Row) -> None:
    w = World()
    for step in row.steps:
        step(w)
    assert w.gpu0.state == row.state
    assert w.codes() == row.codes
    if row.action is not None:
        (cond,) = w.gpu0.conditions
        assert cond.action == row.action and cond.reason in ("GpuRecoveryAction", "ResetRequired")
        assert cond.message
