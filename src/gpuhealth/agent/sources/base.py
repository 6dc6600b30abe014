"""What every source is to the agent runtime: it observes, and it reports on itself.

A source turns the outside world into observations (:mod:`gpuhealth.agent.observations`) and
hands them to a sink until it is cancelled; one that fails raises, and the runtime's supervisor
restarts it with backoff. Everything else the runtime knows about a source it reads through
:class:`SourceStatus`, the same for every source (and for the PodResources refresher, which
reports like a source but feeds allocations, not observations):

- ``up``: its last attempt worked (a silent kernel log that is being followed is up);
- ``ready``: it has started observing (the inventory is known, the log is positioned);
- ``errors``: attempts that failed and that it retried itself (a failed scrape), on top of the
  restarts the runtime counts;
- ``polls``: the duration of each full poll (None for an event-driven source);
- ``counters``: everything else it counts, each declared once (:mod:`gpuhealth.agent.counters`)
  and exported as ``gpuhealth_agent_<name>_total``.
"""

from __future__ import annotations

from typing import Protocol

from gpuhealth.agent.counters import Counters, Histogram
from gpuhealth.agent.observations import ObservationSink, SourceName


class SourceStatus(Protocol):
    """What a running part reports about itself (read by /metrics and readiness)."""

    @property
    def name(self) -> str: ...
    @property
    def up(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def errors(self) -> int: ...
    @property
    def polls(self) -> Histogram | None: ...
    @property
    def counters(self) -> Counters: ...


class Source(SourceStatus, Protocol):
    """A source of observations (NVML, kernel log, dcgm-exporter, simulator)."""

    @property
    def name(self) -> SourceName: ...

    async def run(self, sink: ObservationSink) -> None:
        """Push observations into ``sink`` until cancelled; raise on failure."""
