"""Counters a part of the agent keeps about itself, declared once and always exported.

A part (a source, the health engine) declares each counter once, as a :class:`CounterSpec`
with its name and help text, and increments it through its :class:`Counters`. The metrics
collector exports every declared counter as ``gpuhealth_agent_<name>_total`` (docs/metrics.md)
whether or not it has moved, so a counter cannot be kept and forgotten. Plain ints, updated on
the event loop or in a source's reader threads (hence the lock); a scrape only reads them.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

POLL_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Histogram buckets of ``gpuhealth_agent_poll_duration_seconds``: 1 ms (simulator) to 10 s
(NVML calls waiting on their deadline)."""


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """One counter: exported as ``gpuhealth_agent_<name>_total`` with ``help``."""

    name: str
    help: str
    label: str | None = None
    """The one label that splits the counter (``gpu``), or None for a single series."""


class Counters:
    """The declared counters of one part and their values."""

    __slots__ = ("_lock", "_specs", "_values")

    def __init__(self, *specs: CounterSpec) -> None:
        self._specs = specs
        self._values: dict[str, dict[str, int]] = {s.name: {} for s in specs}
        self._lock = threading.Lock()

    @property
    def specs(self) -> tuple[CounterSpec, ...]:
        return self._specs

    def inc(self, spec: CounterSpec, by: int = 1, *, label: str = "") -> None:
        """Add ``by``; a counter that was not declared is a programming error (KeyError)."""
        values = self._values[spec.name]
        with self._lock:
            values[label] = values.get(label, 0) + by

    def value(self, spec: CounterSpec, label: str = "") -> int:
        return self._values[spec.name].get(label, 0)

    def by_label(self, spec: CounterSpec) -> dict[str, int]:
        return dict(self._values[spec.name])

    def __iter__(self) -> Iterator[tuple[CounterSpec, dict[str, int]]]:
        """Every declared counter with its values by label (``""`` for an unlabelled one)."""
        for spec in self._specs:
            with self._lock:
                values = dict(self._values[spec.name])
            yield spec, (values or ({} if spec.label else {"": 0}))


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
