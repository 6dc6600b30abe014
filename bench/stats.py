"""Summaries of repeated measurements: the median and its spread, and percentiles.

A figure measured once on a shared, noisy machine says little: every benchmark figure is the
median over repetitions, reported with its minimum, maximum and interquartile range.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    min: float
    max: float
    q1: float
    """First quartile (inclusive method); equals the median for fewer than two values."""
    q3: float
    n: int


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    median = statistics.median(ordered)
    if len(ordered) < 2:
        q1 = q3 = median
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Spread(median, ordered[0], ordered[-1], q1, q3, len(ordered))


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats drifting
    return ordered[min(len(ordered), int(rank)) - 1]
