"""The agent's own counters (sources, kernel log, NVML deadlines), read by the metrics collector.

The stream client keeps its own (:class:`agent.stream.metrics.StreamMetrics`).

Components update these plain fields in the event loop; a scrape only reads them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

POLL_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Histogram buckets of ``gpuhealth_agent_poll_duration_seconds``: 1 ms (simulator) to 10 s
(NVML calls waiting on their deadline)."""


@dataclass
class Histogram:
    """Cumulative-bucket histogram without prometheus_client's locking (single-threaded use)."""

    bounds: tuple[float, ...] = POLL_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """``[(le, cumulative count)]`` ending with ``+Inf``, as Prometheus expects."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass
class SourceHealth:
    up: bool = False
    errors_total: int = 0
    last_error: str | None = None


@dataclass
class AgentStats:
    sources: dict[str, SourceHealth] = field(default_factory=dict)
    kmsg_lines_total: int = 0
    kmsg_malformed_lines_total: int = 0
    nvml_call_timeouts: dict[int, int] = field(default_factory=dict)
    """GPU index -> NVML calls that passed their deadline."""
    poll_durations: dict[str, Histogram] = field(default_factory=dict)
    verdicts_cleared_total: int = 0
    """GPUs whose verdict an operator cleared (``gpuhealth-agent clear``)."""

    def source(self, name: str) -> SourceHealth:
        health = self.sources.get(name)
        if health is None:
            health = self.sources[name] = SourceHealth()
        return health

    def source_ok(self, name: str) -> None:
        self.source(name).up = True

    def source_failed(self, name: str, error: str) -> None:
        health = self.source(name)
        health.up = False
        health.errors_total += 1
        health.last_error = error

    def observe_poll(self, source: str, seconds: float) -> None:
        hist = self.poll_durations.get(source)
        if hist is None:
            hist = self.poll_durations[source] = Histogram()
        hist.observe(seconds)
