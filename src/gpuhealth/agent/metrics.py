"""Prometheus exposition of the cached node snapshot (names: docs/metrics.md, a contract).

A custom collector: every scrape renders from :meth:`NodeSnapshotCache.snapshot`, which never calls
NVML or the kubelet, so a scrape costs a few milliseconds however slow the devices are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpuhealth.agent.counters import Counters
from gpuhealth.agent.node_snapshot import NodeSnapshot
from gpuhealth.agent.observations import GpuSample
from gpuhealth.agent.stats import AgentStats
from gpuhealth.agent.stream.metrics import StreamCollector, StreamMetrics

GPU_LABELS = ["node", "gpu", "uuid", "model", "namespace", "pod", "container"]
STATES = ("healthy", "degraded", "unhealthy", "unknown")
THROTTLE_REASONS = (
    "hw_thermal", "sw_thermal", "hw_slowdown", "power_cap",
    "hw_power_brake", "sync_boost", "idle", "applications_clocks",
)  # fmt: skip

# (metric name, help, GpuSample attribute): plain per-GPU gauges.
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuhealth_gpu_temperature_celsius", "GPU core temperature.", "temperature_c"),
    ("gpuhealth_gpu_memory_temperature_celsius", "HBM temperature.", "memory_temperature_c"),
    ("gpuhealth_gpu_slowdown_temperature_celsius", "Slowdown temperature threshold.",
     "slowdown_temperature_c"),
    ("gpuhealth_gpu_shutdown_temperature_celsius", "Shutdown temperature threshold.",
     "shutdown_temperature_c"),
    ("gpuhealth_gpu_power_watts", "Power draw.", "power_w"),
    ("gpuhealth_gpu_power_limit_watts", "Enforced power limit.", "power_limit_w"),
    ("gpuhealth_gpu_utilization_ratio", "SM utilisation, 0..1.", "utilization_ratio"),
    ("gpuhealth_gpu_memory_utilization_ratio", "Memory-bandwidth utilisation, 0..1.",
     "memory_utilization_ratio"),
    ("gpuhealth_gpu_memory_used_bytes", "Framebuffer memory used.", "memory_used_bytes"),
    ("gpuhealth_gpu_memory_total_bytes", "Framebuffer memory total.", "memory_total_bytes"),
    ("gpuhealth_gpu_sm_clock_hertz", "SM clock.", "sm_clock_hz"),
    ("gpuhealth_gpu_memory_clock_hertz", "Memory clock.", "memory_clock_hz"),
    ("gpuhealth_gpu_retired_pages_pending", "1 when page retirement waits for a GPU reset.",
     "retired_pages_pending"),
    ("gpuhealth_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.",
     "row_remap_pending"),
    ("gpuhealth_gpu_row_remap_failure", "1 when a row remap failed.", "row_remap_failure"),
    ("gpuhealth_gpu_nvlink_links_up", "Active NVLinks.", "nvlink_links_up"),
    ("gpuhealth_gpu_fan_speed_ratio", "Fan speed, 0..1.", "fan_speed_ratio"),
    ("gpuhealth_gpu_performance_state", "Performance state (P-state number).",
     "performance_state"),
    ("gpuhealth_gpu_recovery_action", "The driver's GPU recovery action (NVML value, 0: none).",
     "recovery_action"),
)  # fmt: skip

_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("gpuhealth_gpu_pcie_replays", "PCIe replay counter.", "pcie_replay_count"),
    ("gpuhealth_gpu_nvlink_errors", "NVLink replay, recovery and CRC errors.", "nvlink_errors"),
)

# Per MIG GPU instance (GpuInstanceSample attribute), labels gpu_instance and profile.
_INSTANCE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuhealth_gpu_instance_memory_used_bytes", "Framebuffer used by one MIG GPU instance.",
     "memory_used_bytes"),
    ("gpuhealth_gpu_instance_memory_total_bytes", "Framebuffer of one MIG GPU instance.",
     "memory_total_bytes"),
    ("gpuhealth_gpu_instance_utilization_ratio",
     "Graphics-engine activity of one MIG GPU instance, 0..1.", "utilization_ratio"),
)  # fmt: skip

_ECC = (
    ("sbe", "volatile", "ecc_sbe_volatile"),
    ("dbe", "volatile", "ecc_dbe_volatile"),
    ("sbe", "aggregate", "ecc_sbe_aggregate"),
    ("dbe", "aggregate", "ecc_dbe_aggregate"),
)


class _GpuFamilies:
    """The per-GPU families of one scrape, filled GPU by GPU."""

    def __init__(self) -> None:
        self.state = GaugeMetricFamily(
            "gpuhealth_gpu_health_state",
            "1 for the GPU's current state.",
            labels=[*GPU_LABELS, "state"],
        )
        self.cond = GaugeMetricFamily(
            "gpuhealth_gpu_condition",
            "1 per active condition.",
            labels=[*GPU_LABELS, "reason", "code", "severity", "action"],
        )
        self.info = GaugeMetricFamily(
            "gpuhealth_gpu_info",
            "GPU identity; always 1.",
            labels=[*GPU_LABELS, "pci_bus_id", "driver_version", "cuda_version"],
        )
        self.gauges = [GaugeMetricFamily(n, h, labels=GPU_LABELS) for n, h, _ in _GAUGES]
        self.counters = [CounterMetricFamily(n, h, labels=GPU_LABELS) for n, h, _ in _COUNTERS]
        self.throttled = GaugeMetricFamily(
            "gpuhealth_gpu_throttled",
            "1 while the clock reason is active.",
            labels=[*GPU_LABELS, "reason"],
        )
        self.ecc = CounterMetricFamily(
            "gpuhealth_gpu_ecc_errors", "ECC error counts.", labels=[*GPU_LABELS, "type", "scope"]
        )
        self.retired = GaugeMetricFamily(
            "gpuhealth_gpu_retired_pages", "Retired pages.", labels=[*GPU_LABELS, "cause"]
        )
        self.remapped = GaugeMetricFamily(
            "gpuhealth_gpu_remapped_rows", "Remapped rows.", labels=[*GPU_LABELS, "type"]
        )
        self.xid = CounterMetricFamily(
            "gpuhealth_gpu_xid_errors",
            "XIDs seen by the agent.",
            labels=[*GPU_LABELS, "xid", "action"],
        )
        self.op_events = CounterMetricFamily(
            "gpuhealth_gpu_operational_events",
            "GPU Operational Events seen by the agent (each group once), by how they were "
            "judged: code (the catalog knows it), category (unknown code), or the group "
            "attributes that kept them from a verdict (simulated, recovered, previous-error).",
            labels=[*GPU_LABELS, "module", "code", "category", "handled"],
        )
        self.instance = [
            GaugeMetricFamily(n, h, labels=[*GPU_LABELS, "gpu_instance", "profile"])
            for n, h, _ in _INSTANCE_GAUGES
        ]

    def all(self) -> list[Metric]:
        return [
            self.state,
            self.cond,
            self.info,
            *self.gauges,
            *self.counters,
            self.throttled,
            self.ecc,
            self.retired,
            self.remapped,
            self.xid,
            self.op_events,
            *self.instance,
        ]

    def add_sample(self, sample: GpuSample, base: list[str]) -> None:
        for fam, (_, _, attr) in zip(self.gauges, _GAUGES, strict=True):
            v = getattr(sample, attr)
            if v is not None:
                fam.add_metric(base, float(v))
        for cfam, (_, _, attr) in zip(self.counters, _COUNTERS, strict=True):
            v = getattr(sample, attr)
            if v is not None:
                cfam.add_metric(base, float(v))
        reasons = sample.throttle_reasons
        if reasons is not None:
            for r in THROTTLE_REASONS:
                self.throttled.add_metric([*base, r], 1.0 if r in reasons else 0.0)
            for r in sorted(reasons - set(THROTTLE_REASONS)):
                self.throttled.add_metric([*base, r], 1.0)
        for typ, scope, attr in _ECC:
            v = getattr(sample, attr)
            if v is not None:
                self.ecc.add_metric([*base, typ, scope], float(v))
        for fam, label, v in (
            (self.retired, "sbe", sample.retired_pages_sbe),
            (self.retired, "dbe", sample.retired_pages_dbe),
            (self.remapped, "correctable", sample.remapped_rows_correctable),
            (self.remapped, "uncorrectable", sample.remapped_rows_uncorrectable),
        ):
            if v is not None:
                fam.add_metric([*base, label], float(v))
        for gi in sample.gpu_instances:
            labels = [*base, str(gi.instance_id), gi.profile]
            for ifam, (_, _, attr) in zip(self.instance, _INSTANCE_GAUGES, strict=True):
                v = getattr(gi, attr)
                if v is not None:
                    ifam.add_metric(labels, float(v))


def collect_snapshot(snap: NodeSnapshot) -> list[Metric]:
    """Every per-GPU family for one snapshot."""
    f = _GpuFamilies()
    inv = snap.inventory
    driver = (inv.driver_version if inv else None) or ""
    cuda = (inv.cuda_version if inv else None) or ""
    base_by_uuid: dict[str, list[str]] = {}
    for st in snap.statuses:
        gi = st.info
        holder = snap.holder.get(gi.uuid)
        base = [snap.node, str(gi.index), gi.uuid, gi.model]
        base += [holder.namespace, holder.pod, holder.container] if holder else ["", "", ""]
        base_by_uuid[gi.uuid] = base
        for s in STATES:
            f.state.add_metric([*base, s], 1.0 if st.state == s else 0.0)
        for c in st.conditions:
            f.cond.add_metric([*base, c.reason, c.code, c.severity, c.action], 1.0)
        f.info.add_metric([*base, gi.pci_bus_id, driver, cuda], 1.0)
        sample = snap.samples.get(gi.uuid)
        if sample is not None:
            f.add_sample(sample, base)
    for x in snap.xids:
        xbase = base_by_uuid.get(x.uuid)
        if xbase is not None:
            f.xid.add_metric([*xbase, str(x.xid), x.action], float(x.count))
    for e in snap.op_events:
        ebase = base_by_uuid.get(e.uuid)
        if ebase is not None:
            labels = [*ebase, e.module, f"0x{e.code:04x}", e.category, e.handled]
            f.op_events.add_metric(labels, float(e.count))
    return [*f.all(), *collect_node(snap), *collect_nics(snap)]


def collect_node(snap: NodeSnapshot) -> list[Metric]:
    """The node's own verdicts: GPUs missing from the bus (no per-GPU series can say so)."""
    missing = GaugeMetricFamily(
        "gpuhealth_node_gpus_missing",
        "GPUs the node should have (nvml.expected_gpus, else the count at start) that no "
        "source can see.",
        labels=["node"],
    )
    missing.add_metric([snap.node], float(snap.gpus_missing))
    cond = GaugeMetricFamily(
        "gpuhealth_node_condition",
        "1 per active condition of the node itself (not of one GPU).",
        labels=["node", "reason", "code", "severity", "action"],
    )
    for c in snap.node_conditions:
        cond.add_metric([snap.node, c.reason, c.code, c.severity, c.action], 1.0)
    return [missing, cond]


NIC_LABELS = ["node", "device", "port", "link_layer"]
BYTES_PER_GBIT = 1e9 / 8


def collect_nics(snap: NodeSnapshot) -> list[Metric]:
    """The node's InfiniBand and RoCE ports: state, rate, raw counters (PromQL's ``rate()``
    reads them; a reset is a counter reset to it too), flaps, rail verdicts, the GPUs behind."""
    info = GaugeMetricFamily(
        "gpuhealth_rdma_port_info",
        "An InfiniBand or RoCE port; always 1.",
        labels=[*NIC_LABELS, "model", "netdev", "affinity"],
    )
    gpu = GaugeMetricFamily(
        "gpuhealth_rdma_port_gpu",
        "1 per GPU behind the port (PCIe topology): its rail verdicts reach that GPU.",
        labels=["node", "device", "port", "gpu", "uuid"],
    )
    up = GaugeMetricFamily(
        "gpuhealth_rdma_port_up",
        "1 while the port is ACTIVE and LinkUp, 0 otherwise (absent when unreadable).",
        labels=NIC_LABELS,
    )
    state = GaugeMetricFamily(
        "gpuhealth_rdma_port_state",
        "1 for the port's current logical and physical state (the kernel's names).",
        labels=[*NIC_LABELS, "port_state", "phys_state"],
    )
    rate = GaugeMetricFamily(
        "gpuhealth_rdma_port_rate_bytes_per_second",
        "The port's negotiated rate.",
        labels=NIC_LABELS,
    )
    expected = GaugeMetricFamily(
        "gpuhealth_rdma_port_expected_rate_bytes_per_second",
        "The rate the port should have (rdma.rails.expected_rate_gbps for its model, else the "
        "node's most common); absent when not known.",
        labels=NIC_LABELS,
    )
    errors = CounterMetricFamily(
        "gpuhealth_rdma_port_errors",
        "The port's error and link-down counters as the kernel serves them (counters/ and "
        "hw_counters/; the InfiniBand port counters stop at their maximum).",
        labels=[*NIC_LABELS, "counter"],
    )
    saturated = GaugeMetricFamily(
        "gpuhealth_rdma_port_counter_saturated",
        "1 per port counter stuck at its maximum (its growth cannot be seen until reset).",
        labels=[*NIC_LABELS, "counter"],
    )
    flaps = CounterMetricFamily(
        "gpuhealth_rdma_port_flaps",
        "Link-down events of the port counted by the agent since it started (link_downed "
        "growth and downs seen by its polls, each once).",
        labels=NIC_LABELS,
    )
    verdict = GaugeMetricFamily(
        "gpuhealth_rdma_port_verdict",
        "1 per active rail verdict of the port (every GPU behind it carries it as a condition).",
        labels=[*NIC_LABELS, "code", "severity"],
    )
    for p in snap.nics:
        s = p.sample
        base = [snap.node, s.device, str(s.port), s.link_layer]
        info.add_metric([*base, s.model, s.netdev, s.affinity], 1.0)
        for g in p.gpus:
            gpu.add_metric([snap.node, s.device, str(s.port), str(g.index), g.uuid], 1.0)
        if s.up is not None:
            up.add_metric(base, 1.0 if s.up else 0.0)
        if s.port_state is not None or s.phys_state is not None:
            state.add_metric([*base, s.port_state or "", s.phys_state or ""], 1.0)
        if s.rate_gbps is not None:
            rate.add_metric(base, s.rate_gbps * BYTES_PER_GBIT)
        if p.expected_rate_gbps is not None:
            expected.add_metric(base, p.expected_rate_gbps * BYTES_PER_GBIT)
        for name, value in sorted(s.counters.items()):
            errors.add_metric([*base, name], float(value))
        for name in sorted(s.saturated):
            saturated.add_metric([*base, name], 1.0)
        flaps.add_metric(base, float(p.flaps_total))
        for c in p.verdicts:
            verdict.add_metric([*base, c.code, c.severity], 1.0)
    return [info, gpu, up, state, rate, expected, errors, saturated, flaps, verdict]


def collect_stats(stats: AgentStats, version: str) -> list[Metric]:
    """The agent's own health: its sources and every counter its parts declare (the stream's
    are :class:`~gpuhealth.agent.stream.metrics.StreamCollector`'s)."""
    up = GaugeMetricFamily(
        "gpuhealth_agent_source_up", "1 when the source's last attempt worked.", labels=["source"]
    )
    errors = CounterMetricFamily(
        "gpuhealth_agent_source_errors",
        "Source failures: restarts, and attempts the source retried itself.",
        labels=["source"],
    )
    poll = HistogramMetricFamily(
        "gpuhealth_agent_poll_duration_seconds", "One poll of all GPUs.", labels=["source"]
    )
    for r in sorted(stats.sources(), key=lambda r: r.name):
        up.add_metric([r.name], 1.0 if r.up else 0.0)
        errors.add_metric([r.name], float(r.errors))
        if r.polls is not None:
            poll.add_metric([r.name], r.polls.cumulative(), sum_value=r.polls.total)
    blind = GaugeMetricFamily(
        "gpuhealth_agent_rule_blind",
        "1 when the source serves none of the fields a health rule needs (the rule cannot "
        "fire), 0 when it serves one; absent until the source's first good poll.",
        labels=["source", "rule"],
    )
    for cov in sorted(stats.coverage(), key=lambda c: c.source):
        for rule, is_blind in sorted(cov.blind.items()):
            blind.add_metric([cov.source, rule], 1.0 if is_blind else 0.0)
    build = GaugeMetricFamily(
        "gpuhealth_agent_build_info", "Agent version; always 1.", labels=["version"]
    )
    build.add_metric([version], 1.0)
    unobservable = GaugeMetricFamily(
        "gpuhealth_agent_xid_unobservable",
        "1 per XID none of the configured sources can report (NVML events cannot report 79, "
        "119, 120; the kernel log is off).",
        labels=["xid"],
    )
    for xid in stats.unobservable_xids:
        unobservable.add_metric([str(xid)], 1.0)
    paths = GaugeMetricFamily(
        "gpuhealth_agent_event_paths",
        "1 per path that brings the driver's error events and runs now, 0 when configured but "
        "off (operational_events: GPU Operational Events, drivers R615+; nvml_xid: NVML's Xid "
        "event set; kmsg: the kernel log; dcgm: dcgm-exporter).",
        labels=["path"],
    )
    for path, active in sorted(stats.event_paths().items()):
        paths.add_metric([path], 1.0 if active else 0.0)
    return [
        up,
        errors,
        poll,
        blind,
        *collect_counters(stats.counters()),
        build,
        unobservable,
        paths,
    ]


def collect_counters(parts: Iterable[Counters]) -> list[Metric]:
    """One family per declared counter: ``gpuhealth_agent_<name>_total``."""
    out: list[Metric] = []
    for counters in parts:
        for spec, values in counters:
            labels = [spec.label] if spec.label else []
            fam = CounterMetricFamily(f"gpuhealth_agent_{spec.name}", spec.help, labels=labels)
            for label in sorted(values, key=_label_order):
                fam.add_metric([label] if spec.label else [], float(values[label]))
            out.append(fam)
    return out


def _label_order(value: str) -> tuple[int, str]:
    """GPU indexes in numeric order, other values after them."""
    return (int(value), "") if value.isdigit() else (1 << 30, value)


class SnapshotCollector(Collector):
    def __init__(
        self, snapshot: Callable[[], NodeSnapshot], stats: AgentStats, version: str
    ) -> None:
        self._snapshot = snapshot
        self._stats = stats
        self._version = version

    def collect(self) -> Iterator[Metric]:
        yield from collect_snapshot(self._snapshot())
        yield from collect_stats(self._stats, self._version)


def make_registry(
    snapshot: Callable[[], NodeSnapshot],
    version: str,
    stats: AgentStats,
    stream: StreamMetrics | None = None,
) -> CollectorRegistry:
    """gpuhealth's collectors only (no default process/platform collectors).

    The stream's families are always exported; without a controller they read "disconnected".
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, stats, version))
    registry.register(StreamCollector(stream or StreamMetrics()))
    return registry
