"""The agent's report about itself, read by /metrics: each source's state and every counter.

Nothing is copied on a timer: a scrape asks the supervisor whether each source's task runs and
how often it crashed, and asks each source (:class:`~gpuhealth.agent.sources.base.SourceReport`)
the rest. The stream client keeps its own (:class:`gpuhealth.agent.stream.metrics.StreamMetrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gpuhealth.agent.counters import Counters, Histogram
from gpuhealth.agent.sources.base import SourceReport

SOURCE_TASK_PREFIX = "source-"


def source_task(name: str) -> str:
    """The supervised task that runs the source called ``name``."""
    return f"{SOURCE_TASK_PREFIX}{name}"


class TaskStatus(Protocol):
    """The supervisor, as far as the report needs it."""

    def status(self) -> Mapping[str, Mapping[str, object]]: ...


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
        self._sources: list[tuple[str, SourceReport]] = []
        self._counters: list[Counters] = []

    def add_source(self, report: SourceReport, task: str) -> None:
        """Report ``report`` (run by the supervised task ``task``) and its counters."""
        self._sources.append((task, report))
        self._counters.append(report.counters)

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

    def counters(self) -> list[Counters]:
        return list(self._counters)
