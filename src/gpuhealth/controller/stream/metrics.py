"""The stream server's counters as plain attributes, plus a collector that exports them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass
class StreamServerMetrics:
    messages: Counter[str] = field(default_factory=Counter)
    """Accepted agent messages by type (hello, snapshot, event, heartbeat), duplicates included."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Connections refused, by reason."""
    errors: Counter[str] = field(default_factory=Counter)
    """Frames answered with an Error, by error code."""
    revoked: Counter[str] = field(default_factory=Counter)
    """Live streams cut because their token's pod went away, by reason."""
    orders: Counter[str] = field(default_factory=Counter)
    """Remediation orders written to agents, by type (``order-reset-gpu`` ...)."""
    deferred: Counter[str] = field(default_factory=Counter)
    """Agents told to come back later (admission pacing), by reason."""
    admission: Callable[[], tuple[int, int, int]] | None = None
    """(handshakes in progress, handshakes waiting for a turn, connections let in at the door
    whose Hello is not queued yet), set by the stream server."""
    tokens: Counter[str] = field(default_factory=Counter)
    """Agent tokens verified, by how: ``local`` (by the controller), ``forged`` (a signature
    that is not the issuer's) or ``review_<why>`` (sent to a TokenReview)."""
    gone: Counter[str] = field(default_factory=Counter)
    """Connections found closed by the agent during a handshake or a write, by stage; no
    work is spent on them past that point."""


class StreamServerCollector(Collector):
    def __init__(self, metrics: StreamServerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        if self._m.admission is not None:
            in_flight, waiting, arriving = self._m.admission()
            yield GaugeMetricFamily(
                "gpuhealth_stream_admission_in_flight",
                "Agent handshakes in progress (token review, pod check, accept)",
                value=float(in_flight),
            )
            yield GaugeMetricFamily(
                "gpuhealth_stream_admission_waiting",
                "Agent handshakes waiting for a turn",
                value=float(waiting),
            )
            yield GaugeMetricFamily(
                "gpuhealth_stream_admission_arriving",
                "Agent connections upgraded whose Hello has not reached admission yet",
                value=float(arriving),
            )
        for name, doc, label, values in (
            ("gpuhealth_stream_messages", "Accepted agent messages", "type", self._m.messages),
            ("gpuhealth_stream_rejected", "Connections refused", "reason", self._m.rejected),
            ("gpuhealth_stream_errors", "Frames answered with an Error", "code", self._m.errors),
            (
                "gpuhealth_stream_revoked",
                "Live streams cut because their token's pod is gone",
                "reason",
                self._m.revoked,
            ),
            (
                "gpuhealth_stream_orders",
                "Remediation orders sent to agents",
                "type",
                self._m.orders,
            ),
            (
                "gpuhealth_stream_deferred",
                "Agents told to come back later by admission pacing",
                "reason",
                self._m.deferred,
            ),
            (
                "gpuhealth_stream_tokens",
                "Agent tokens verified, locally or by a TokenReview (and why)",
                "how",
                self._m.tokens,
            ),
            (
                "gpuhealth_stream_gone",
                "Agent connections found closed during a handshake or a write",
                "stage",
                self._m.gone,
            ),
        ):
            fam = CounterMetricFamily(name, doc, labels=[label])
            for key in sorted(values):
                fam.add_metric([key], float(values[key]))
            yield fam
