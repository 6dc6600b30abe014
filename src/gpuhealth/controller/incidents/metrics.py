"""The incidents' metrics, exported at scrape time from the book, the judge and the unwatched
watch."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuhealth.controller.incidents.judge import JudgeStats
from gpuhealth.controller.incidents.model import KINDS, IncidentBook


class IncidentCollector(Collector):
    def __init__(
        self,
        book: IncidentBook,
        stats: JudgeStats | None,
        unwatched: Callable[[], int] | None = None,
    ) -> None:
        self._book = book
        self._stats = stats
        self._unwatched = unwatched

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "gpuhealth_incidents_open", "Open fleet-level incidents by kind", labels=["kind"]
        )
        opened = CounterMetricFamily(
            "gpuhealth_incidents_opened", "Fleet-level incidents opened by kind", labels=["kind"]
        )
        counts = self._book.counts()
        for kind in KINDS:
            open_.add_metric([kind], counts[kind])
            opened.add_metric([kind], self._book.opened_total[kind])
        yield open_
        yield opened
        reports = CounterMetricFamily(
            "gpuhealth_incident_xid_reports",
            "Application-class XID reports judged at the fleet level, by class",
            labels=["xid_class"],
        )
        delay = GaugeMetricFamily(
            "gpuhealth_incident_decision_delay_seconds",
            "Seconds from the last report to the latest incident opened, by kind",
            labels=["kind"],
        )
        if self._stats is not None:
            for cls, n in sorted(self._stats.reports.items()):
                reports.add_metric([cls], n)
            for which, seconds in sorted(self._stats.last_delay_s.items()):
                delay.add_metric([which], seconds)
        yield reports
        yield delay
        if self._unwatched is not None:
            yield GaugeMetricFamily(
                "gpuhealth_unwatched_gpu_nodes",
                "GPU nodes whose gpuhealth agent has not reported for longer than the grace",
                value=self._unwatched(),
            )
