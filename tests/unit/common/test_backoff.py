"""The one backoff: exponential, capped, jittered, never overflowing, reset after a stable run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.stream.settings import BackoffSettings
from gpuhealth.common.backoff import (
    Backoff,
    BackoffPolicy,
    backoff_delay,
    capped_exponential,
    stretched,
)

S = BackoffSettings(initial_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.5, 1.0),
        (2, 0.5, 2.0),
        (3, 0.5, 4.0),
        (5, 0.5, 10.0),
        (50, 0.5, 10.0),
        (1026, 0.5, 10.0),  # 2.0 ** 1025 would overflow
        (10**9, 0.5, 10.0),
        (0, 0.5, 1.0),
        (1, 0.0, 0.5),
        (1, 0.999999, 1.5),
        (4, 0.0, 4.0),
    ],
)
def test_backoff_delay(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(S, attempt, lambda: rand) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("attempt", "initial", "maximum", "factor", "expected"),
    [
        (1, 0.05, 30.0, 2.0, 0.05),
        (3, 0.05, 30.0, 2.0, 0.2),
        (2000, 0.05, 30.0, 2.0, 30.0),
        (5, 1.0, 8.0, 1.0, 1.0),  # no growth
        (3, 5.0, 2.0, 2.0, 2.0),  # initial above the cap
        (3, 0.0, 2.0, 2.0, 0.0),
        (4, 0.1, 0.5, 2.0, 0.5),
        (3, 0.1, 0.5, 2.0, 0.4),
    ],
)
def test_capped_exponential(
    attempt: int, initial: float, maximum: float, factor: float, expected: float
) -> None:
    assert capped_exponential(attempt, initial, maximum, factor) == pytest.approx(expected)


@given(
    attempt=st.integers(min_value=-10, max_value=10**12),
    initial=st.floats(min_value=1e-6, max_value=100.0),
    maximum=st.floats(min_value=1e-6, max_value=1e6),
    factor=st.floats(min_value=1.0, max_value=10.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    rand=st.floats(min_value=0.0, max_value=0.999999),
)
def test_any_attempt_gives_a_bounded_delay(
    attempt: int, initial: float, maximum: float, factor: float, jitter: float, rand: float
) -> None:
    policy = BackoffPolicy(initial_s=initial, max_s=maximum, factor=factor, jitter=jitter)
    delay = backoff_delay(policy, attempt, lambda: rand)
    assert 0.0 <= delay <= maximum * (1 + jitter) * (1 + 1e-9)


def test_delays_never_shrink_as_attempts_grow() -> None:
    policy = BackoffPolicy(initial_s=0.5, max_s=30.0)
    delays = [backoff_delay(policy, n, lambda: 0.5) for n in range(1, 2000)]
    assert delays == sorted(delays) and delays[-1] == 30.0


def test_backoff_counts_and_resets() -> None:
    b = Backoff(S, lambda: 0.5)
    assert [b.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    b.reset()
    assert b.next_delay() == 1.0


def test_a_stable_run_starts_the_count_again() -> None:
    b = Backoff(S, lambda: 0.5, stable_after_s=30.0)
    assert [b.after_run(1.0) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert b.after_run(30.0) == 1.0 and b.attempt == 1
    assert b.after_run(29.9) == 2.0


@pytest.mark.parametrize(
    ("told", "jitter", "rand", "expected"),
    [
        (10.0, 0.5, 0.0, 10.0),  # never sooner than told
        (10.0, 0.5, 0.5, 12.5),
        (10.0, 0.5, 0.999999, 15.0),  # at most jitter x told later
        (10.0, 0.0, 0.9, 10.0),  # no jitter: exactly as told
        (0.0, 0.5, 0.7, 0.0),
        (-3.0, 0.5, 0.7, 0.0),
        (2.0, 2.0, 0.5, 4.0),
    ],
)
def test_stretched(told: float, jitter: float, rand: float, expected: float) -> None:
    assert stretched(told, jitter, lambda: rand) == pytest.approx(expected, rel=1e-5)
