"""The one backoff: capped exponential delays with jitter (pure: the random source is injected).

Every retry loop in the project waits through this module: the supervisor between restarts
of a crashed task (:mod:`gpuhealth.common.tasks`), the agent's stream client between
reconnects, the controller's work queues between retries of a key, and the LIST+WATCH loop
between failed watches (:mod:`gpuhealth.controller.kube.informer`).

The delay before attempt ``n`` (1-based) is ``initial_s x factor^(n-1)``, capped at ``max_s``,
then spread by ``± jitter`` of itself. It is computed without ever raising the factor to a
large power, so any attempt number (a task that crashed a million times) gives ``max_s``
instead of an :class:`OverflowError`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

Rand = Callable[[], float]
"""Returns a float in [0, 1)."""


class BackoffShape(Protocol):
    """What a backoff needs to know (a settings struct or a :class:`BackoffPolicy`)."""

    @property
    def initial_s(self) -> float: ...

    @property
    def max_s(self) -> float: ...

    @property
    def factor(self) -> float: ...

    @property
    def jitter(self) -> float: ...


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    initial_s: float
    """First delay."""
    max_s: float
    """Longest delay, however many attempts failed."""
    factor: float = 2.0
    """Growth of the delay per failed attempt."""
    jitter: float = 0.0
    """Random spread around each delay, as a fraction of it (0 = none)."""


def capped_exponential(attempt: int, initial_s: float, max_s: float, factor: float) -> float:
    """``initial_s x factor^(attempt-1)`` capped at ``max_s``, without overflow for any
    ``attempt`` (attempts below 1 count as 1)."""
    if initial_s <= 0.0:
        return 0.0
    if initial_s >= max_s:
        return max_s
    steps = max(0, attempt - 1)
    if factor <= 1.0 or steps == 0:
        return initial_s
    if steps >= math.log(max_s / initial_s) / math.log(factor):
        return max_s
    return min(max_s, initial_s * factor**steps)


def backoff_delay(shape: BackoffShape, attempt: int, rand: Rand) -> float:
    """Delay before retry ``attempt`` (1-based), jittered by ``rand()``."""
    base = capped_exponential(attempt, shape.initial_s, shape.max_s, shape.factor)
    return spread(base, shape.jitter, rand)


def spread(base: float, jitter: float, rand: Rand) -> float:
    """``base`` moved at random by up to ``± jitter`` of itself (never below 0)."""
    width = base * jitter
    return max(0.0, base - width + 2.0 * width * rand())


def stretched(told_s: float, jitter: float, rand: Rand) -> float:
    """A delay someone told us to wait (a "retry after"): never sooner, up to ``jitter`` of it
    later, so that clients told the same delay spread out."""
    told = max(0.0, told_s)
    return told * (1.0 + jitter * rand())


class Backoff:
    """Counts consecutive failures: ``next_delay()`` after each, ``reset()`` once the thing
    retried has proved itself (a connection stayed up, a watch delivered, a task ran long).

    With ``stable_after_s``, :meth:`after_run` does both: a run that lasted at least that long
    before it failed starts the count again, so that a thing that fails once an hour always
    waits the first delay, and the count stays bounded however long the process lives.
    """

    def __init__(
        self, shape: BackoffShape, rand: Rand = random.random, *, stable_after_s: float = math.inf
    ) -> None:
        self._shape = shape
        self._rand = rand
        self.stable_after_s = stable_after_s
        self.attempt = 0

    def next_delay(self) -> float:
        self.attempt += 1
        return backoff_delay(self._shape, self.attempt, self._rand)

    def after_run(self, ran_s: float) -> float:
        """The delay after a run of ``ran_s`` seconds that failed."""
        if ran_s >= self.stable_after_s:
            self.reset()
        return self.next_delay()

    def reset(self) -> None:
        self.attempt = 0
