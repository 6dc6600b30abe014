"""Reconnect backoff: exponential, capped, jittered, reset after a long connection."""

from __future__ import annotations

import pytest

from gpuhealth.agent.stream.backoff import Backoff, backoff_delay, retry_after_delay
from gpuhealth.agent.stream.settings import BackoffSettings

S = BackoffSettings(initial_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.5, 1.0),
        (2, 0.5, 2.0),
        (3, 0.5, 4.0),
        (5, 0.5, 10.0),
        (50, 0.5, 10.0),
        (1, 0.0, 0.5),
        (1, 0.999999, 1.5),
        (4, 0.0, 4.0),
    ],
)
def test_backoff_delay(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(S, attempt, lambda: rand) == pytest.approx(expected, rel=1e-5)


def test_backoff_counts_and_resets() -> None:
    b = Backoff(S, lambda: 0.5)
    assert [b.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    b.reset()
    assert b.next_delay() == 1.0


@pytest.mark.parametrize(
    ("told", "jitter", "rand", "expected"),
    [
        (10.0, 0.5, 0.0, 10.0),  # never sooner than told
        (10.0, 0.5, 0.5, 12.5),
        (10.0, 0.5, 0.999999, 15.0),  # at most jitter x told later
        (10.0, 0.0, 0.9, 10.0),  # no jitter: exactly as told
        (0.0, 0.5, 0.7, 0.0),
        (2.0, 2.0, 0.5, 4.0),
    ],
)
def test_retry_after_delay(told: float, jitter: float, rand: float, expected: float) -> None:
    settings = BackoffSettings(retry_after_jitter=jitter)
    assert retry_after_delay(settings, told, lambda: rand) == pytest.approx(expected, rel=1e-5)
