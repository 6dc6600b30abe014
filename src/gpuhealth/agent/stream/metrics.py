"""The stream client's metrics as plain attributes, plus a collector that exports them.

The agent runtime may read the attributes into its own collector, or register
:class:`StreamCollector` in its registry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass
class StreamMetrics:
    connected: bool = False
    outbox_messages: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    """Messages dropped, by kind: ``heartbeat`` (the outbox was full) or ``invalid`` (failed
    protocol validation, never queued)."""
    corrupt_records: int = 0
    """Times the state store was found damaged at start-up (moved aside, a new one started)."""
    outbox_write_errors: int = 0
    """Outbox records that could not be written (the message was kept in memory only)."""
    connects: int = 0
    disconnects: int = 0
    deferred: int = 0
    """Times the controller answered "come back later" (admission pacing) and was honoured."""
    shard: int = 0
    """The shard whose controller URL the agent dials (0 with one shard)."""
    shard_moves: int = 0
    """Times a replica that does not own this node's shard named the one that does."""
    bad_shard_headers: int = 0
    """Refusals whose ``Gpuhealth-Shard`` header named no shard (ignored)."""
    orders_refused: Counter[str] = field(default_factory=Counter)
    """Remediation orders refused before anything was done, by reason (``disabled``,
    ``plaintext-stream``)."""


class StreamCollector(Collector):
    def __init__(self, metrics: StreamMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self._m
        yield GaugeMetricFamily(
            "gpuhealth_agent_stream_connected",
            "1 while connected to the controller",
            value=1.0 if m.connected else 0.0,
        )
        yield GaugeMetricFamily(
            "gpuhealth_agent_outbox_messages",
            "Unacknowledged messages on disk",
            value=float(m.outbox_messages),
        )
        dropped = CounterMetricFamily(
            "gpuhealth_agent_outbox_dropped",
            "Messages dropped when the outbox was full (heartbeats only)",
            labels=["kind"],
        )
        for kind in sorted(set(m.dropped) | {"heartbeat"}):
            dropped.add_metric([kind], float(m.dropped[kind]))
        yield dropped
        yield CounterMetricFamily(
            "gpuhealth_agent_outbox_corrupt_records",
            "Times the damaged state store was moved aside at start-up",
            value=float(m.corrupt_records),
        )
        yield CounterMetricFamily(
            "gpuhealth_agent_stream_deferred",
            "Times the controller asked the agent to come back later (admission pacing)",
            value=float(m.deferred),
        )
        yield GaugeMetricFamily(
            "gpuhealth_agent_stream_shard",
            "The shard whose controller URL the agent dials (0 with one shard)",
            value=float(m.shard),
        )
        yield CounterMetricFamily(
            "gpuhealth_agent_stream_shard_moves",
            "Times a replica that does not own this node's shard named the shard that does",
            value=float(m.shard_moves),
        )
        yield CounterMetricFamily(
            "gpuhealth_agent_stream_bad_shard_headers",
            "Refusals whose Gpuhealth-Shard header named no shard (ignored)",
            value=float(m.bad_shard_headers),
        )
        yield CounterMetricFamily(
            "gpuhealth_agent_outbox_write_errors",
            "Outbox writes that failed (message kept in memory only)",
            value=float(m.outbox_write_errors),
        )
        refused = CounterMetricFamily(
            "gpuhealth_agent_orders_refused",
            "Remediation orders refused before anything was done, by reason (disabled: "
            "remediation is off on this agent; plaintext-stream: the stream is not TLS)",
            labels=["reason"],
        )
        for reason in sorted(set(m.orders_refused) | {"disabled", "plaintext-stream"}):
            refused.add_metric([reason], float(m.orders_refused[reason]))
        yield refused
