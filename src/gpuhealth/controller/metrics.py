"""The controller's Prometheus metrics (names: docs/metrics.md), one registry per controller.

Counters and the histogram are updated where things happen; the gauges that describe state
(fleet, taints held, breaker, leadership) are computed at scrape time by :class:`GaugeCollector`,
except the series with one sample per node, which it writes as text itself (``node_series``):
through prometheus_client (a Sample per series, then its generic formatting) a scrape of 19,000
nodes held the event loop 190 ms; written directly it takes a tenth of that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.kube.informer import Informer
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import Keys


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
        self.gc_seconds = Histogram(
            "gpuhealth_controller_gc_seconds",
            "How long each garbage collection held the process, by generation (controller/heap.py)",
            ["generation"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        for generation in ("0", "1", "2"):
            self.gc_seconds.labels(generation)
        self.events_dropped = Counter(
            "gpuhealth_controller_events_dropped",
            "Kubernetes Events dropped (queue full or write failed)",
            registry=registry,
        )


class WatchCollector(Collector):
    """``gpuhealth_watch_not_found_total{resource}``: the 404s each watch cache's informer met
    after its first successful LIST (:mod:`gpuhealth.controller.kube.informer`: the cache was
    kept and the LIST retried with backoff)."""

    def __init__(self, informers: Iterable[Informer]) -> None:
        self._informers = tuple(informers)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "gpuhealth_watch_not_found",
            "404s on a watch cache's LIST or WATCH after its first successful LIST (the cache "
            "kept, retried with backoff)",
            labels=["resource"],
        )
        for informer in self._informers:
            family.add_metric([informer.what], float(informer.not_found))
        yield family


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
    def __init__(self, src: GaugeInputs, registry: CollectorRegistry | None = None) -> None:
        """Registered in ``registry`` when given (as prometheus_client's own metrics are)."""
        self._s = src
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._s
        yield GaugeMetricFamily(
            "gpuhealth_controller_is_leader", "1 on the leader", value=float(s.is_leader())
        )
        yield CounterMetricFamily(
            "gpuhealth_gpu_pods_started",
            "Pods that newly hold a GPU, as the agents report (PodResources); a node's first "
            "report to this controller is not counted",
            value=float(s.fleet.gpu_pods_started),
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

    def node_series(self) -> bytes:
        """The per-node gauges in Prometheus' text format (0.0.4), for after the registry's:
        ``gpuhealth_node_agent_connected{node}`` and ``gpuhealth_node_tainted{effect,key,
        node,reason}``, labels in the order prometheus_client writes them."""
        s = self._s
        out = [
            "# HELP gpuhealth_node_agent_connected 1 while the node's agent streams\n"
            "# TYPE gpuhealth_node_agent_connected gauge\n"
        ]
        out += [
            f'gpuhealth_node_agent_connected{{node="{_label(name)}"}} {value}\n'
            for name, value in sorted(
                (rec.name, "1.0" if rec.connected else "0.0") for rec in s.fleet.nodes()
            )
        ]
        out.append(
            "# HELP gpuhealth_node_tainted 1 per taint gpuhealth holds\n"
            "# TYPE gpuhealth_node_tainted gauge\n"
        )
        for view in s.node_views():
            for t in view.taints:
                key = str(t.get("key", ""))
                if s.keys.owns(key):
                    out.append(
                        f'gpuhealth_node_tainted{{effect="{_label(str(t.get("effect", "")))}",'
                        f'key="{_label(key)}",node="{_label(view.name)}",'
                        f'reason="{_label(str(t.get("value") or ""))}"}} 1.0\n'
                    )
        return "".join(out).encode()


def _label(value: str) -> str:
    """A label value escaped as the text format wants (backslash, double quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
    return value
