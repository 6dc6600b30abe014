"""The incidents' metrics, exported at scrape time from what people see of the incidents (the
book on the leader, the GPUIncident objects elsewhere), the judge and the unwatched watch.

``gpuhealth_incident`` has one series per open incident with its ``lifecycle`` (``paging``,
``acknowledged``, ``silenced``): the alert rules leave out the incidents on-call acknowledged
or silenced (deploy/prometheus/rules.yaml).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuhealth.common.clock import Clock
from gpuhealth.controller.incidents.judge import JudgeStats
from gpuhealth.controller.incidents.model import KINDS, Incident, IncidentBook, IncidentReader


def _where(i: Incident) -> tuple[str, str]:
    """(domain, node) labels of an incident."""
    if i.kind == "domain":
        return i.key, ""
    if i.kind == "job" or len(i.subjects.nodes) != 1:
        return "", ""
    return "", i.subjects.nodes[0]


class IncidentCollector(Collector):
    def __init__(
        self,
        book: IncidentBook,
        stats: JudgeStats | None,
        unwatched: Callable[[], int] | None = None,
        *,
        shown: IncidentReader | None = None,
        clock: Clock | None = None,
        invalid: Callable[[], int] | None = None,
    ) -> None:
        self._book = book
        self._shown: IncidentReader = shown if shown is not None else book
        self._stats = stats
        self._unwatched = unwatched
        self._clock = clock
        self._invalid = invalid

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "gpuhealth_incidents_open", "Open fleet-level incidents by kind", labels=["kind"]
        )
        opened = CounterMetricFamily(
            "gpuhealth_incidents_opened", "Fleet-level incidents opened by kind", labels=["kind"]
        )
        counts = self._shown.counts()
        for kind in KINDS:
            open_.add_metric([kind], counts[kind])
            opened.add_metric([kind], self._book.opened_total[kind])
        yield open_
        yield opened
        each = GaugeMetricFamily(
            "gpuhealth_incident",
            "1 for each open fleet-level incident, by kind, its domain or node, and whether it "
            "pages (lifecycle: paging, acknowledged, silenced)",
            labels=["id", "kind", "domain", "node", "lifecycle"],
        )
        if self._clock is not None:
            now = self._clock.now()
            for i in self._shown.list():
                domain, node = _where(i)
                each.add_metric([i.id, i.kind, domain, node, i.paging(now)], 1)
        yield each
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
                "GPU nodes whose gpuhealth agent has not reported for longer than the grace "
                "(counted by the leader)",
                value=self._unwatched(),
            )
        if self._invalid is not None:
            yield CounterMetricFamily(
                "gpuhealth_incident_objects_invalid",
                "GPUIncident objects skipped because they are not valid (written past the "
                "schema, another version)",
                value=self._invalid(),
            )
