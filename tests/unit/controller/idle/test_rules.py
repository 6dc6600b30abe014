"""The pure idle rules: windows, verdicts, per-namespace policy, event cadence; and the
settings they are built from."""

from __future__ import annotations

import msgspec
import pytest

from gpuhealth.controller.idle.rules import (
    IdlePolicies,
    IdlePolicy,
    UsageWindow,
    event_due,
    observe,
    start_window,
    verdict,
)
from gpuhealth.controller.idle.settings import IdleConfig
from tests.support.clock import FakeClock

POLICY = IdlePolicy(threshold_ratio=0.05, window_s=1800.0)
GAP = 300.0


def run(reports: list[tuple[float, float]], clock: FakeClock) -> UsageWindow:
    """Feed (seconds-after-previous, ratio) reports through the window, advancing ``clock``."""
    w: UsageWindow | None = None
    for delay, ratio in reports:
        clock.advance(delay)
        if w is None:
            w = start_window(ratio, clock.monotonic(), POLICY.threshold_ratio)
        else:
            observe(w, ratio, clock.monotonic(), POLICY.threshold_ratio, GAP)
    assert w is not None
    return w


def every(step: float, total: float, ratio: float) -> list[tuple[float, float]]:
    return [(step, ratio)] * int(total // step)


@pytest.mark.parametrize(
    ("name", "reports", "then_s", "idle", "reason"),
    [
        ("idle for a full window", [(0, 0.0), *every(60, 1800, 0.01)], 0, True, "idle"),
        ("just under a window", [(0, 0.0), *every(60, 1740, 0.01)], 0, False, "too-young"),
        ("exactly at threshold is busy", [(0, 0.05), *every(60, 1800, 0.05)], 0, False, "busy"),
        (
            "one busy report resets the run",
            [(0, 0.0), *every(60, 1200, 0.0), (60, 0.9), *every(60, 1200, 0.0)],
            0,
            False,
            "recent-activity",
        ),
        (
            "busy early, idle for a window after",
            [(0, 0.9), *every(60, 600, 0.9), *every(60, 1800, 0.02)],
            0,
            True,
            "idle",
        ),
        (
            "a gap longer than max_gap restarts idleness",
            [(0, 0.0), *every(60, 1200, 0.0), (900, 0.0), *every(60, 1200, 0.0)],
            0,
            False,
            "recent-activity",
        ),
        (
            "no reports lately: stale, not idle",
            [(0, 0.0), *every(60, 1800, 0.0)],
            400,
            False,
            "stale",
        ),
        ("busy now", [(0, 0.0), *every(60, 1800, 0.0), (60, 0.5)], 0, False, "busy"),
    ],
)
def test_verdict_table(
    name: str, reports: list[tuple[float, float]], then_s: float, idle: bool, reason: str
) -> None:
    clock = FakeClock()
    w = run(reports, clock)
    clock.advance(then_s)
    v = verdict(w, POLICY, clock.monotonic(), GAP)
    assert (v.idle, v.reason) == (idle, reason), name


def test_idle_duration_counts_from_first_idle_report() -> None:
    clock = FakeClock()
    w = run([(0, 0.8), (60, 0.01), *every(60, 3600, 0.01)], clock)
    v = verdict(w, POLICY, clock.monotonic(), GAP)
    assert v.idle
    # the first idle report covers the minute after the busy one
    assert v.idle_for_s == pytest.approx(3660.0)


def test_out_of_order_report_is_ignored() -> None:
    clock = FakeClock()
    w = run([(0, 0.0), *every(60, 1800, 0.0)], clock)
    observe(w, 0.9, clock.monotonic() - 30, POLICY.threshold_ratio, GAP)
    assert verdict(w, POLICY, clock.monotonic(), GAP).idle


def test_exempt_policy_never_idle() -> None:
    clock = FakeClock()
    w = run([(0, 0.0), *every(60, 7200, 0.0)], clock)
    exempt = IdlePolicy(exempt=True)
    assert verdict(w, exempt, clock.monotonic(), GAP).reason == "exempt"


@pytest.mark.parametrize(
    ("idle_for", "window", "last", "due"),
    [
        (1799.0, 1800.0, None, False),
        (1800.0, 1800.0, None, True),
        (1900.0, 1800.0, 1800.0, False),
        (3599.0, 1800.0, 1800.0, False),
        (3600.0, 1800.0, 1800.0, True),
        (3700.0, 1800.0, 3600.0, False),
        (1850.0, 1800.0, 5400.0, True),  # a new idle run after a busy spell
    ],
)
def test_event_once_per_window(
    idle_for: float, window: float, last: float | None, due: bool
) -> None:
    assert event_due(idle_for, window, last) is due


def test_policies_from_config() -> None:
    cfg = msgspec.convert(
        {
            "threshold_ratio": 0.1,
            "window_s": 600,
            "exempt_namespaces": ["kube-system", "batch-dev"],
            "namespaces": {
                "research": {"threshold_ratio": 0.02, "window_s": 3600},
                "batch-dev": {"window_s": 60},
                "notebooks": {"exempt": True},
            },
        },
        IdleConfig,
    )
    p = IdlePolicies.from_config(cfg)
    assert p.for_namespace("default") == IdlePolicy(threshold_ratio=0.1, window_s=600)
    assert p.for_namespace("research") == IdlePolicy(threshold_ratio=0.02, window_s=3600)
    assert p.for_namespace("kube-system").exempt
    assert p.for_namespace("batch-dev").exempt
    assert p.for_namespace("notebooks").exempt


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold_ratio": 1.5},
        {"window_s": 0},
        {"max_allocations": 0},
        {"namespaces": {"x": {"threshold_ratio": -0.1}}},
        {"namespaces": {"x": {"window_s": -1}}},
        {"unknown_key": 1},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises((msgspec.ValidationError, ValueError)):
        msgspec.convert(bad, IdleConfig)
