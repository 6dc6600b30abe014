"""Idle GPU allocations: the pure rules (no I/O, no clock of its own).

An allocation (namespace, pod, container, GPU) is *idle* when every utilisation figure the
agent reported for it stayed under the namespace's threshold for a whole window (default 5 %
over 30 min) and the allocation has been seen at least that long, so a pod that only just
started is never flagged. Each allocation keeps O(1) state: when it was first seen, when the
last figure arrived, and since when it has been continuously under the threshold. A gap in
the reports longer than ``max_gap_s`` breaks the evidence: idleness restarts after the gap,
so a disconnected agent never makes a pod look idle.

Times are monotonic seconds (``Clock.monotonic()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuhealth.controller.idle.settings import (
    DEFAULT_THRESHOLD_RATIO,
    DEFAULT_WINDOW_S,
    IdleSettings,
)


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """The rule for one namespace. ``exempt`` namespaces are never flagged."""

    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO
    """Utilisation strictly below this (0..1) counts as idle."""
    window_s: float = DEFAULT_WINDOW_S
    """How long utilisation must stay under the threshold, and the minimum time running."""
    exempt: bool = False


@dataclass(frozen=True, slots=True)
class IdlePolicies:
    """Resolves the policy of a namespace; built once from :class:`IdleSettings`."""

    default: IdlePolicy = field(default_factory=IdlePolicy)
    overrides: Mapping[str, IdlePolicy] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: IdleSettings) -> IdlePolicies:
        default = IdlePolicy(threshold_ratio=cfg.threshold_ratio, window_s=cfg.window_s)
        overrides: dict[str, IdlePolicy] = {
            ns: IdlePolicy(
                threshold_ratio=default.threshold_ratio, window_s=default.window_s, exempt=True
            )
            for ns in cfg.exempt_namespaces
        }
        for ns, o in cfg.namespaces.items():
            overrides[ns] = IdlePolicy(
                threshold_ratio=(
                    o.threshold_ratio if o.threshold_ratio is not None else default.threshold_ratio
                ),
                window_s=o.window_s if o.window_s is not None else default.window_s,
                exempt=o.exempt or ns in cfg.exempt_namespaces,
            )
        return cls(default=default, overrides=overrides)

    def for_namespace(self, namespace: str) -> IdlePolicy:
        return self.overrides.get(namespace, self.default)


@dataclass(slots=True)
class UsageWindow:
    """What is remembered about one allocation between reports (O(1) per allocation)."""

    first_seen: float
    last_seen: float
    idle_since: float | None
    """Start of the current run of under-threshold reports; ``None`` while busy."""


def start_window(ratio: float, at: float, threshold: float) -> UsageWindow:
    """The window after the first report of an allocation."""
    return UsageWindow(first_seen=at, last_seen=at, idle_since=at if ratio < threshold else None)


def observe(w: UsageWindow, ratio: float, at: float, threshold: float, max_gap_s: float) -> None:
    """Fold one report (``ratio`` at ``at``) into ``w``.

    A report summarises the time since the previous one, so an idle run that follows a busy
    report starts at the previous report. A report that is out of order (older than the last
    one) is ignored. After a gap longer than ``max_gap_s`` idleness restarts at this report:
    nobody knows what happened in between.
    """
    if at < w.last_seen:
        return
    previous = w.last_seen
    w.last_seen = at
    if ratio >= threshold:
        w.idle_since = None
    elif at - previous > max_gap_s:
        w.idle_since = at
    elif w.idle_since is None:
        w.idle_since = previous


class IdleVerdict(NamedTuple):
    """A tuple (cheap to build: the tracker evaluates tens of thousands per pass)."""

    idle: bool
    idle_for_s: float
    """How long utilisation has stayed under the threshold (0 while busy)."""
    reason: str
    """``idle``, ``busy``, ``recent-activity`` (under the threshold for less than a
    window), ``exempt``, ``too-young`` (seen for less than a window), ``stale`` (no recent
    report)."""


_BUSY = IdleVerdict(idle=False, idle_for_s=0.0, reason="busy")
_EXEMPT = IdleVerdict(idle=False, idle_for_s=0.0, reason="exempt")
_STALE = IdleVerdict(idle=False, idle_for_s=0.0, reason="stale")


def verdict(w: UsageWindow, policy: IdlePolicy, now: float, max_gap_s: float) -> IdleVerdict:
    """Is the allocation idle at ``now``?

    Idle when it is not exempt, reports are current (the last one is at most ``max_gap_s``
    old), it has been seen for at least the window, and every report during the last window
    was under the threshold.
    """
    if policy.exempt:
        return _EXEMPT
    if now - w.last_seen > max_gap_s:
        return _STALE
    if w.idle_since is None:
        return _BUSY
    idle_for = now - w.idle_since
    if now - w.first_seen < policy.window_s:
        return IdleVerdict(idle=False, idle_for_s=idle_for, reason="too-young")
    if idle_for < policy.window_s:
        return IdleVerdict(idle=False, idle_for_s=idle_for, reason="recent-activity")
    return IdleVerdict(idle=True, idle_for_s=idle_for, reason="idle")


def event_due(idle_for_s: float, window_s: float, last_event_idle_for_s: float | None) -> bool:
    """Whether to write a ``GPUIdle`` Event now: once when idleness reaches a window, then once
    per further window of the same idle run (``last_event_idle_for_s`` is the idle duration
    at the previous Event of this run, ``None`` if none)."""
    if idle_for_s < window_s:
        return False
    if last_event_idle_for_s is None or last_event_idle_for_s > idle_for_s:
        return True
    return int(idle_for_s // window_s) > int(last_event_idle_for_s // window_s)
