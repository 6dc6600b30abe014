"""Benchmark registry.

A bench module (``bench/bench_*.py``) defines ``BENCHMARKS``: a list of :class:`Benchmark`.
The harness (``python -m bench``) calls each ``run`` :attr:`Benchmark.repeats` times; a call
returns ``{metric: value}`` (one repetition) or ``{metric: [values]}`` (repetitions the
benchmark made itself, e.g. rounds inside one control plane it starts once). Every metric it
reports must have a :class:`Target`, which is checked against the median of all repetitions
(:mod:`bench.stats`); the spread is reported beside it. Where what matters is a ratio, a
benchmark also measures a baseline of the same size in the same run, interleaved with the
measurement, and reports the ratio as a metric of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_REPEATS = 5
"""Repetitions of a benchmark whose one run takes seconds at most."""

Samples = Mapping[str, float | Sequence[float]]


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
    run: Callable[[], Awaitable[Samples]]
    needs_kube: bool = False
    repeats: int = DEFAULT_REPEATS
    """How many times the harness calls :attr:`run`."""
