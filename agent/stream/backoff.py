"""Exponential reconnect backoff with jitter, and the controller's "come back after N s"
honoured with jitter (pure: the random source is injected)."""

from __future__ import annotations

import random
from collections.abc import Callable

from gpuhealth.agent.stream.settings import BackoffSettings


def backoff_delay(settings: BackoffSettings, attempt: int, rand: Callable[[], float]) -> float:
    """Delay before reconnect ``attempt`` (1-based); ``rand()`` returns a float in [0, 1)."""
    base = min(settings.max_s, settings.initial_s * settings.factor ** min(max(0, attempt - 1), 60))
    spread = base * settings.jitter
    return max(0.0, base - spread + 2 * spread * rand())


def retry_after_delay(
    settings: BackoffSettings, retry_after_s: float, rand: Callable[[], float]
) -> float:
    """Delay before coming back when the controller said "after ``retry_after_s``": never
    sooner, and up to ``retry_after_jitter`` of it later, so that agents told the same delay
    spread out."""
    told = max(0.0, retry_after_s)
    return told * (1.0 + settings.retry_after_jitter * rand())


class Backoff:
    """Counts consecutive failures; ``reset()`` after a connection proved stable."""

    def __init__(
        self, settings: BackoffSettings, rand: Callable[[], float] = random.random
    ) -> None:
        self._settings = settings
        self._rand = rand
        self.attempt = 0

    def next_delay(self) -> float:
        self.attempt += 1
        return backoff_delay(self._settings, self.attempt, self._rand)

    def reset(self) -> None:
        self.attempt = 0
