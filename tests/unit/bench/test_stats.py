"""Benchmark figures: the median of repetitions with its spread, percentiles, and the harness
that repeats a benchmark and checks its target against the median."""

from __future__ import annotations

import pytest

from bench.__main__ import collect_samples, result_row
from bench.registry import Benchmark, Target
from bench.stats import percentile, spread


def test_spread_of_repetitions() -> None:
    s = spread([5.0, 1.0, 11.0, 3.0, 4.0])
    assert (s.median, s.min, s.max, s.n) == (4.0, 1.0, 11.0, 5)
    assert (s.q1, s.q3) == (3.0, 5.0)
    one = spread([2.5])
    assert (one.median, one.q1, one.q3, one.min, one.max) == (2.5, 2.5, 2.5, 2.5, 2.5)
    with pytest.raises(ValueError):
        spread([])


@pytest.mark.parametrize(("q", "want"), [(50, 50.0), (99, 99.0), (100, 100.0), (1, 1.0)])
def test_nearest_rank_percentile(q: float, want: float) -> None:
    assert percentile([float(v) for v in range(100, 0, -1)], q) == want


async def test_harness_repeats_and_judges_the_median() -> None:
    noisy = iter([1.0, 9.0, 2.0])  # one outlier of three

    async def run() -> dict[str, float | list[float]]:
        return {"latency_ms": next(noisy), "rounds": [10.0, 12.0]}

    target = Target("latency_ms", "ms", 5.0, "<=")
    b = Benchmark("b", (target, Target("rounds", "1/s", 11.0, ">=")), run, repeats=3)
    samples = await collect_samples(b, b.repeats)
    assert samples == {"latency_ms": [1.0, 9.0, 2.0], "rounds": [10.0, 12.0] * 3}
    row = result_row(b, target, samples["latency_ms"], None)
    assert (row["value"], row["min"], row["max"], row["runs"]) == (2.0, 1.0, 9.0, 3)
    assert row["met"] is True  # the median meets it although one run did not
    rounds = result_row(b, b.targets[1], samples["rounds"], None)
    assert rounds["value"] == 11.0 and rounds["met"] is True and rounds["runs"] == 6
    failed = result_row(b, target, [], "RuntimeError: boom")
    assert failed["value"] is None and failed["met"] is None and failed["runs"] == 0
