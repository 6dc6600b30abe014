"""Small state machines the health engine is built from: hysteresis and windowed counters.

Both are allocation-free on the common path (a sample that changes nothing), because they
run for every rule of every GPU on every poll.
"""

from __future__ import annotations

from collections import deque


class Hysteresis:
    """A threshold verdict with hysteresis.

    Raises after ``raise_after`` consecutive bad samples that also span ``sustain_s`` seconds;
    clears only after ``clear_after_s`` seconds without a bad sample, or ``clear_after``
    consecutive good samples when that is set (device flags). A single noisy sample never
    flips it either way.
    """

    __slots__ = ("active", "bad_since", "clear_after", "clear_after_s", "good_streak",
                 "last_bad", "raise_after", "streak", "sustain_s")  # fmt: skip

    def __init__(
        self,
        *,
        raise_after: int,
        clear_after_s: float,
        sustain_s: float = 0.0,
        clear_after: int = 0,
    ) -> None:
        self.raise_after = max(1, raise_after)
        self.clear_after_s = clear_after_s
        self.sustain_s = sustain_s
        self.clear_after = clear_after
        self.active = False
        self.streak = 0
        self.good_streak = 0
        self.bad_since = 0.0
        self.last_bad = 0.0

    def update(self, bad: bool, now: float) -> bool:
        """Feed one sample; return True when ``active`` changed."""
        if bad:
            if self.streak == 0:
                self.bad_since = now
            self.streak += 1
            self.good_streak = 0
            self.last_bad = now
            if (
                not self.active
                and self.streak >= self.raise_after
                and now - self.bad_since >= self.sustain_s
            ):
                self.active = True
                return True
            return False
        self.streak = 0
        if not self.active:
            return False
        self.good_streak += 1
        if self.clear_after and self.good_streak >= self.clear_after:
            return self._clear()
        return self.expire(now)

    def expire(self, now: float) -> bool:
        """Time-based clearing (called from ticks too); True when it cleared."""
        if (
            self.active
            and not self.clear_after
            and self.streak == 0
            and now - self.last_bad >= self.clear_after_s
        ):
            return self._clear()
        return False

    def force(self, now: float) -> bool:
        """Raise at once (an event the device itself signalled); it clears as usual. True
        when ``active`` changed."""
        self.streak = max(self.streak, self.raise_after)
        self.good_streak = 0
        self.last_bad = now
        if self.active:
            return False
        self.active = True
        return True

    def _clear(self) -> bool:
        self.active = False
        self.good_streak = 0
        return True

    def reset(self) -> None:
        self.active = False
        self.streak = 0
        self.good_streak = 0


class WindowDelta:
    """How much a cumulative counter grew within the last ``window_s`` seconds.

    Stores a point only when the counter changes, so a quiet counter costs nothing. A counter
    that goes backwards (driver reload, GPU reset) restarts the window.
    """

    __slots__ = ("_points", "baseline", "last", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()
        self.baseline: int | None = None
        """The counter's value at the start of the window."""
        self.last: int | None = None

    def update(self, value: int | None, now: float) -> int:
        """Feed the current cumulative value; return the growth within the window."""
        if value is None:
            return 0
        last = self.last
        if last is None or value < last:
            self._points.clear()
            self.baseline = value
            self.last = value
            return 0
        if value != last:
            self._points.append((now, value))
            self.last = value
        return self.delta(now)

    def delta(self, now: float) -> int:
        points = self._points
        horizon = now - self.window_s
        while points and points[0][0] < horizon:
            self.baseline = points.popleft()[1]
        if self.last is None or self.baseline is None:
            return 0
        return self.last - self.baseline

    def reset(self) -> None:
        self._points.clear()
        self.baseline = None
        self.last = None
