"""The one severity order of health states (protocol.HEALTH_STATES), for agent and controller."""

from __future__ import annotations

import itertools

import pytest

from gpuhealth.protocol import HEALTH_STATES, severity, worst_state
from gpuhealth.protocol.v1 import HealthState


def test_order_is_healthy_degraded_unknown_unhealthy() -> None:
    assert HEALTH_STATES == ("healthy", "degraded", "unknown", "unhealthy")
    assert [severity(s) for s in HEALTH_STATES] == [0, 1, 2, 3]


def test_every_health_state_has_a_rank() -> None:
    assert set(HealthState.__args__) == set(HEALTH_STATES)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("states", "worst"),
    [
        ((), "healthy"),
        (("healthy", "healthy"), "healthy"),
        (("degraded", "healthy"), "degraded"),
        (("degraded", "unknown"), "unknown"),
        (("unknown", "unhealthy", "degraded"), "unhealthy"),
    ],
)
def test_worst_state(states: tuple[HealthState, ...], worst: str) -> None:
    assert worst_state(states) == worst


def test_worst_state_is_the_maximum_in_any_order() -> None:
    for combo in itertools.product(HEALTH_STATES, repeat=3):
        assert worst_state(combo) == max(combo, key=severity)
        assert worst_state(reversed(combo)) == worst_state(combo)


def test_an_unrecognised_state_ranks_as_unknown() -> None:
    assert severity("exploded") == severity("unknown")
    assert worst_state((), default="unknown") == "unknown"
