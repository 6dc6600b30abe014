"""Benchmark registry.

A bench module (``bench/bench_*.py``) defines ``BENCHMARKS``: a list of :class:`Benchmark`.
Each ``run`` returns ``{metric_name: value}`` for one or more metrics; every metric it
reports must have a :class:`Target`. Benchmarks measure medians over repetitions
themselves: the machine is noisy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Target:
    metric: str
    unit: str
    limit: float
    direction: Literal["<=", ">="]

    def met(self, value: float) -> bool:
        return value <= self.limit if self.direction == "<=" else value >= self.limit


@dataclass(frozen=True)
class Benchmark:
    name: str
    targets: tuple[Target, ...]
    run: Callable[[], Awaitable[dict[str, float]]]
    needs_kube: bool = False
