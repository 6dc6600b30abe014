"""Remediation metrics: time in each stage, outcomes, evictions, orders, gate refusals.

Stages (from the episode's phase timestamps, observed when an episode reaches the stage's
end): ``quarantine`` detected -> quarantined, ``drain`` quarantined -> drained,
``remediate`` drained -> remediated, ``validate`` remediated -> validated, ``return``
validated -> returned (quarantine lifted), ``total`` detected -> returned. The gauges are
computed from the episode cache at scrape time; ``phase_age_seconds`` carries the
episode's ``status.reason`` (what it waits for, why it escalated) for the alert rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuhealth.controller.remediation.model import TERMINAL_PHASES, Episode, Phase

STAGES: tuple[tuple[str, str, str], ...] = (
    ("quarantine", "detected", "quarantined"),
    ("drain", "quarantined", "drained"),
    ("remediate", "drained", "remediated"),
    ("validate", "remediated", "validated"),
    ("return", "validated", "returned"),
    ("total", "detected", "returned"),
)
BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)


class RemediationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.stage_seconds = Histogram(
            "gpuhealth_remediation_stage_duration_seconds",
            "Time an episode took for each stage of the loop",
            ["stage", "action"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.started = Counter(
            "gpuhealth_remediation_started", "Episodes created", ["action"], registry=registry
        )
        self.outcomes = Counter(
            "gpuhealth_remediation_outcomes",
            "Episodes that ended (returned, escalated, failed)",
            ["outcome", "action", "reason"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpuhealth_remediation_evictions",
            "Eviction requests by result (evicted, blocked by a PDB, gone, error)",
            ["result"],
            registry=registry,
        )
        self.orders = Counter(
            "gpuhealth_remediation_orders",
            "Orders sent to agents (delivered or not)",
            ["action", "result"],
            registry=registry,
        )
        self.gate_blocked = Counter(
            "gpuhealth_remediation_gate_blocked",
            "Disruptive steps the hard-write gate (circuit breaker) refused",
            ["kind"],
            registry=registry,
        )
        self.errors = Counter(
            "gpuhealth_remediation_errors",
            "Episode passes that failed (retried with backoff)",
            registry=registry,
        )
        self.holds = Counter(
            "gpuhealth_remediation_holds",
            "Holds that began, by reason (BlastRadiusCap: a drain over a blast-radius cap; "
            "ManagedRepair: a managed repairer owns the node)",
            ["reason"],
            registry=registry,
        )
        self.managed_repairs = Counter(
            "gpuhealth_remediation_managed_repairs",
            "Episodes whose node a managed repairer was found to own, by owner",
            ["owner"],
            registry=registry,
        )
        self.replacements = Counter(
            "gpuhealth_remediation_replacements",
            "Replacements of escalated nodes, by method and result (requested, skipped, "
            "failed, completed)",
            ["method", "result"],
            registry=registry,
        )

    def transition(self, ep: Episode, frm: Phase, to: Phase) -> None:
        """``ep`` (its new status) moved from ``frm`` to ``to``: observe the stage that just
        ended, count the outcome."""
        stage = _STAGE_ENDED.get((frm, to))
        if stage is not None and not (stage == "validate" and ep.status.release_handled):
            self._stage(ep, stage)
        if to in (Phase.FAILED, Phase.ESCALATED):
            self.outcomes.labels(to.value.lower(), ep.spec.action, ep.status.reason).inc()

    def returned(self, ep: Episode) -> None:
        """The quarantine was seen lifted: the last stages end."""
        self._stage(ep, "return")
        self._stage(ep, "total")
        self.outcomes.labels("returned", ep.spec.action, ep.status.reason).inc()

    def _stage(self, ep: Episode, stage: str) -> None:
        start_mark, end_mark = _MARKS[stage]
        start = getattr(ep.status.times, start_mark)
        end = getattr(ep.status.times, end_mark)
        if start is not None and end is not None and end >= start:
            self.stage_seconds.labels(stage, ep.spec.action).observe((end - start).total_seconds())


_MARKS = {stage: (start, end) for stage, start, end in STAGES}
_STAGE_ENDED: dict[tuple[Phase, Phase], str] = {
    (Phase.PENDING, Phase.QUARANTINED): "quarantine",
    (Phase.DRAINING, Phase.REMEDIATING): "drain",
    (Phase.REMEDIATING, Phase.VALIDATING): "remediate",
    (Phase.VALIDATING, Phase.RETURNED): "validate",
}


class RemediationCollector(Collector):
    """Episodes by phase, how long each unfinished episode has been in its phase, and the
    objects the episode watch skipped as no valid GPURemediation."""

    def __init__(
        self,
        episodes: Callable[[], list[Episode]],
        now: Callable[[], datetime],
        invalid: Callable[[], int] = lambda: 0,
    ) -> None:
        self._episodes = episodes
        self._now = now
        self._invalid = invalid

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "gpuhealth_remediation_invalid_objects",
            "GPURemediation objects skipped as invalid (written by hand past the schema, or by "
            "another version): logged, never acted on",
            value=float(self._invalid()),
        )
        episodes = self._episodes()
        now = self._now()
        by_phase = GaugeMetricFamily(
            "gpuhealth_remediation_episodes_by_phase",
            "GPURemediation episodes by phase",
            labels=["phase"],
        )
        counts = dict.fromkeys((p.value for p in Phase), 0)
        for ep in episodes:
            counts[ep.phase.value] += 1
        for phase, n in counts.items():
            by_phase.add_metric([phase], float(n))
        yield by_phase
        age = GaugeMetricFamily(
            "gpuhealth_remediation_phase_age_seconds",
            "Seconds each unfinished (or escalated, its node not replaced) episode has been in "
            "its phase",
            labels=["node", "phase", "action", "reason"],
        )
        for ep in sorted(episodes, key=lambda e: e.name):
            if ep.phase in TERMINAL_PHASES and (ep.phase is not Phase.ESCALATED or ep.replaced):
                continue
            since = getattr(ep.status.times, ep.phase.value.lower())
            if since is not None:
                age.add_metric(
                    [ep.node, ep.phase.value, ep.spec.action, ep.status.reason],
                    max(0.0, (now - since).total_seconds()),
                )
        yield age
