"""The controller's Prometheus metrics (names: docs/metrics.md), one registry per controller.

Counters and the histogram are updated where things happen; the gauges that describe state
(fleet, taints held, breaker, leadership) are computed at scrape time by :class:`GaugeCollector`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.taints.policy import Keys


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reconcile = Counter(
            "gpuhealth_reconcile", "Reconcile passes", ["result"], registry=registry
        )
        self.reconcile_seconds = Histogram(
            "gpuhealth_reconcile_duration_seconds",
            "One node's reconcile",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.taint_ops = Counter(
            "gpuhealth_taint_operations", "Taint writes", ["op", "result"], registry=registry
        )
        self.loop_lag = Histogram(
            "gpuhealth_controller_event_loop_lag_seconds",
            "How much later than due the event loop ran a periodic check (controller/loop_lag.py)",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.events_dropped = Counter(
            "gpuhealth_controller_events_dropped",
            "Kubernetes Events dropped (queue full or write failed)",
            registry=registry,
        )


@dataclass
class GaugeInputs:
    fleet: Fleet
    breaker: CircuitBreaker
    keys: Keys
    is_leader: Callable[[], bool]
    node_views: Callable[[], list[NodeView]]
    dra_rules: Callable[[], int]
    fleet_cache: FleetCache | None = None
    """Counts by state kept per node (None: the fleet view is built at each scrape)."""

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Nodes and GPUs by state."""
        if self.fleet_cache is None:
            counts = build_fleet_view(self.fleet, self.node_views(), self.keys).counts()
            return counts.nodes, counts.gpus
        self.fleet_cache.refresh_some(self.fleet_cache.dirty)
        return dict(self.fleet_cache.node_counts), dict(self.fleet_cache.gpu_counts)


class GaugeCollector(Collector):
    def __init__(self, src: GaugeInputs) -> None:
        self._s = src

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._s
        yield GaugeMetricFamily(
            "gpuhealth_controller_is_leader", "1 on the leader", value=float(s.is_leader())
        )
        yield GaugeMetricFamily(
            "gpuhealth_circuit_breaker_open",
            "1 while new taints are blocked",
            value=float(s.breaker.is_open),
        )
        yield GaugeMetricFamily(
            "gpuhealth_dra_device_taint_rules",
            "DeviceTaintRules gpuhealth holds",
            value=float(s.dra_rules()),
        )
        yield GaugeMetricFamily(
            "gpuhealth_controller_connected_agents",
            "Live agent streams",
            value=float(s.fleet.connected_count()),
        )
        nodes, gpus = s.counts()
        for name, doc, by_state in (
            ("gpuhealth_nodes", "Nodes by worst GPU state", nodes),
            ("gpuhealth_gpus", "GPUs by state", gpus),
        ):
            fam = GaugeMetricFamily(name, doc, labels=["state"])
            for state, n in sorted(by_state.items()):
                fam.add_metric([state], float(n))
            yield fam
        connected = GaugeMetricFamily(
            "gpuhealth_node_agent_connected", "1 while the node's agent streams", labels=["node"]
        )
        for rec in sorted(s.fleet.nodes(), key=lambda r: r.name):
            connected.add_metric([rec.name], float(rec.connected))
        yield connected
        tainted = GaugeMetricFamily(
            "gpuhealth_node_tainted",
            "1 per taint gpuhealth holds",
            labels=["node", "key", "effect", "reason"],
        )
        for view in s.node_views():
            for t in view.taints:
                key = str(t.get("key", ""))
                if s.keys.owns(key):
                    tainted.add_metric(
                        [view.name, key, str(t.get("effect", "")), str(t.get("value") or "")], 1.0
                    )
        yield tainted
