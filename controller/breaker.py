"""Circuit breaker: at most a fraction of GPU nodes newly hard-tainted within a window.

Pure state plus an injected clock. A false-positive storm (a bad driver push, a parser bug,
one job crashing on many nodes) must not cordon the fleet: once the number of distinct
nodes that gained a NoSchedule/NoExecute taint from gpuhealth within ``window_s`` would pass
``max(min_nodes, floor(max_fraction x GPU nodes))``, the breaker opens and stays open until an
operator resets it (docs/operations.md). A node admitted within the window keeps its
admission until the window passes, also once the breaker is open: its node taint, NoExecute
and device taints are one verdict, counted once (``controller.hard_writes``). Removing taints
is never blocked; PreferNoSchedule taints are not counted or blocked (they never keep a pod
off a node). The window (:meth:`CircuitBreaker.window`) is stored with the open/closed state
(``controller.breaker_sync``), so a restarted controller or a new leader keeps counting it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.controller.settings import BreakerSettings


class Verdict(Enum):
    ALLOW = "allow"
    BLOCK = "block"
    TRIP = "trip"
    """Blocked, and this request opened the breaker (emit the Event, log loudly)."""


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    open: bool
    trips: int
    tripped_at: datetime | None
    recent_nodes: int
    limit: int
    blocked_nodes: tuple[str, ...]


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings | None = None, clock: Clock | None = None) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock or SystemClock()
        self._recent: OrderedDict[str, float] = OrderedDict()
        """Node -> monotonic time it was allowed a new hard taint, oldest first."""
        self.is_open = False
        self.trips = 0
        self.tripped_at: datetime | None = None
        self._blocked: set[str] = set()
        self._limit = 0
        self.version = 0
        """Bumped on every trip, reset, restore and node admitted to the window (the state
        syncer writes on change)."""

    def limit(self, gpu_nodes: int) -> int:
        return max(self.settings.min_nodes, math.floor(self.settings.max_fraction * gpu_nodes))

    def _prune(self) -> None:
        horizon = self._clock.monotonic() - self.settings.window_s
        while self._recent and next(iter(self._recent.values())) < horizon:
            self._recent.popitem(last=False)

    def request(self, node: str, gpu_nodes: int) -> Verdict:
        """May ``node`` gain a hard taint now? An allowed request is counted at once, so that
        concurrent workers cannot overshoot the limit."""
        if not self.settings.enabled:
            return Verdict.ALLOW
        self._prune()
        if node in self._recent:
            return Verdict.ALLOW  # admitted in this window: its whole verdict, even once open
        if self.is_open:
            self._blocked.add(node)
            return Verdict.BLOCK
        self._limit = self.limit(gpu_nodes)
        if len(self._recent) + 1 > self._limit:
            self.is_open = True
            self.trips += 1
            self.tripped_at = self._clock.now()
            self._blocked.add(node)
            self.version += 1
            return Verdict.TRIP
        self._recent[node] = self._clock.monotonic()
        self.version += 1
        return Verdict.ALLOW

    def request_group(self, nodes: Iterable[str], gpu_nodes: int) -> Verdict:
        """May every one of ``nodes`` gain a hard taint now? All or none: the group (an
        NVLink domain, ``controller.domain_incidents``) is admitted whole when its nodes not
        yet in the window fit in the budget together, else every one of them is blocked (and
        the request opens the breaker). Nodes admitted in the window stay admitted."""
        if not self.settings.enabled:
            return Verdict.ALLOW
        self._prune()
        new = [n for n in dict.fromkeys(nodes) if n not in self._recent]
        if not new:
            return Verdict.ALLOW
        if self.is_open:
            self._blocked.update(new)
            return Verdict.BLOCK
        self._limit = self.limit(gpu_nodes)
        if len(self._recent) + len(new) > self._limit:
            self.is_open = True
            self.trips += 1
            self.tripped_at = self._clock.now()
            self._blocked.update(new)
            self.version += 1
            return Verdict.TRIP
        mono = self._clock.monotonic()
        for n in new:
            self._recent[n] = mono
        self.version += 1
        return Verdict.ALLOW

    def reset(self) -> list[str]:
        """Operator action: close, forget the window; returns the nodes that were blocked
        (the caller requeues them)."""
        blocked = sorted(self._blocked)
        self.is_open = False
        self._recent.clear()
        self._blocked.clear()
        self.version += 1
        return blocked

    def restore(self, *, is_open: bool, trips: int, tripped_at: datetime | None) -> None:
        """Adopt the state a previous leader stored (an open breaker stays open)."""
        self.is_open = is_open
        self.trips = max(self.trips, trips)
        self.tripped_at = tripped_at
        self.version += 1

    def window(self) -> list[tuple[str, datetime]]:
        """The nodes admitted within the window, oldest first, with the wall-clock time of
        their admission (what the state syncer stores)."""
        self._prune()
        now, mono = self._clock.now(), self._clock.monotonic()
        return [(node, now - timedelta(seconds=mono - t)) for node, t in self._recent.items()]

    def restore_window(self, entries: Iterable[tuple[str, datetime]]) -> None:
        """Adopt the window a previous leader stored: nodes it admitted still count until
        their admission is ``window_s`` old (a restart gives no fresh budget)."""
        now, mono = self._clock.now(), self._clock.monotonic()
        merged = dict(self._recent)
        for node, at in entries:
            t = mono - max(0.0, (now - at).total_seconds())
            merged[node] = max(merged.get(node, t), t)
        self._recent = OrderedDict(sorted(merged.items(), key=lambda kv: kv[1]))
        self._prune()
        self.version += 1

    def status(self) -> BreakerStatus:
        self._prune()
        return BreakerStatus(
            open=self.is_open,
            trips=self.trips,
            tripped_at=self.tripped_at,
            recent_nodes=len(self._recent),
            limit=self._limit,
            blocked_nodes=tuple(sorted(self._blocked)),
        )
