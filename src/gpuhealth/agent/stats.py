"""The agent's account of itself, read by /metrics: each source's state and every counter.

Nothing is copied on a timer: a scrape asks the supervisor whether each source's task runs and
how often it crashed, and asks each source (:class:`~gpuhealth.agent.sources.base.SourceStatus`)
the rest. The stream client keeps its own (:class:`gpuhealth.agent.stream.metrics.StreamMetrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpuhealth.agent.counters import Counters, Histogram
from gpuhealth.agent.sources.base import SourceStatus

SOURCE_TASK_PREFIX = "source-"


def source_task(name: str) -> str:
    """The supervised task that runs the source called ``name``."""
    return f"{SOURCE_TASK_PREFIX}{name}"


class TaskStatus(Protocol):
    """The supervisor, as far as these stats need it."""

    def status(self) -> Mapping[str, Mapping[str, object]]: ...


@runtime_checkable
class RuleCoverage(Protocol):
    """A source that can tell which health rules its data leaves blind (dcgm-exporter)."""

    @property
    def name(self) -> str: ...
    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule it judges."""
        ...

    def blind_rules(self) -> Mapping[str, tuple[str, ...]] | None:
        """Rule -> the fields it lacks, for the blind ones; None while not known yet."""
        ...


@runtime_checkable
class NvmlEventPaths(Protocol):
    """A source with event paths of its own (NVML: the Xid event set, operational events)."""

    def event_paths(self) -> Mapping[str, bool]:
        """Path -> whether it runs now."""
        ...


EVENT_PATH_SOURCES = {"kmsg": "kmsg", "dcgm": "dcgm"}
"""Sources that are an event path by themselves (source name -> path)."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """One source's rules at the time of a scrape: rule -> blind."""

    source: str
    blind: dict[str, bool]


@dataclass(frozen=True, slots=True)
class SourceReading:
    """One source at the time of a scrape."""

    name: str
    up: bool
    """Its task runs and its last attempt worked."""
    errors: int
    """Restarts of its task plus the failed attempts it retried itself."""
    last_error: str | None
    polls: Histogram | None


class AgentStats:
    def __init__(self, tasks: TaskStatus) -> None:
        self._tasks = tasks
        self._sources: list[tuple[str, SourceStatus]] = []
        self._counters: list[Counters] = []
        self._coverage: list[RuleCoverage] = []
        self._paths: list[NvmlEventPaths] = []
        self.unobservable_xids: tuple[int, ...] = ()
        """XIDs none of the configured sources can report (NVML without the kernel log)."""

    def add_source(self, report: SourceStatus, task: str) -> None:
        """Report ``report`` (run by the supervised task ``task``), its counters and, where
        it judges them, its blind rules."""
        self._sources.append((task, report))
        self._counters.append(report.counters)
        if isinstance(report, RuleCoverage):
            self._coverage.append(report)
        if isinstance(report, NvmlEventPaths):
            self._paths.append(report)

    def add_counters(self, counters: Counters) -> None:
        """Export the counters of a part that is not a source (the health engine)."""
        self._counters.append(counters)

    def sources(self) -> list[SourceReading]:
        status = self._tasks.status()
        out = []
        for task, report in self._sources:
            st = status.get(task, {})
            failures = st.get("failures", 0)
            last = st.get("last_error")
            out.append(
                SourceReading(
                    name=report.name,
                    up=bool(st.get("running")) and report.up,
                    errors=(failures if isinstance(failures, int) else 0) + report.errors,
                    last_error=last if isinstance(last, str) else None,
                    polls=report.polls,
                )
            )
        return out

    def event_paths(self) -> dict[str, bool]:
        """Which paths bring the driver's error events: ``operational_events``, ``nvml_xid``
        (NVML's sources), ``kmsg``, ``dcgm`` (those sources, while up)."""
        out: dict[str, bool] = {}
        for src in self._paths:
            out.update(src.event_paths())
        for reading in self.sources():
            path = EVENT_PATH_SOURCES.get(reading.name)
            if path is not None:
                out[path] = out.get(path, False) or reading.up
        return out

    def counters(self) -> list[Counters]:
        return list(self._counters)

    def coverage(self) -> list[Coverage]:
        """Sources that know their blind rules by now (after their first good poll)."""
        out = []
        for src in self._coverage:
            blind = src.blind_rules()
            if blind is not None:
                out.append(Coverage(src.name, {rule: rule in blind for rule in src.rules}))
        return out
