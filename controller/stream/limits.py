"""Per-connection message rate limit (token bucket, clock-driven, pure)."""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, now: float) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, now: float, n: float = 1.0) -> bool:
        """Spend ``n`` tokens if available at time ``now`` (monotonic seconds)."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False
