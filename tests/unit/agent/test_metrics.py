"""The exporter's collector, from hand-built snapshots (names: docs/metrics.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.agent.exposition import render
from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.sources.kmsg.source import KMSG_FILE_MISMATCHES, KMSG_LINES, KMSG_MALFORMED
from gpuhealth.agent.sources.nvml.source import NVML_CALL_TIMEOUTS
from gpuhealth.agent.sources.rdma.source import RDMA_READ_ERRORS, RDMA_READ_TIMEOUTS
from gpuhealth.agent.stats import AgentStats
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.protocol import Condition
from tests.support.agent import (
    XID79,
    Tasks,
    alloc,
    engine_with,
    every_part,
    rail,
    status,
    uuid,
)
from tests.support.clock import FakeClock

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def _samples(
    state: NodeSnapshotCache, stream: StreamMetrics | None = None, stats: AgentStats | None = None
) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = render(_registry(state, stream, stats)).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _doc_agent_names() -> set[str]:
    agent_part = DOCS.read_text().split("## Controller")[0]
    names: set[str] = set()
    for line in agent_part.splitlines():
        if line.startswith("| `gpuhealth_"):
            names.update(re.findall(r"`(gpuhealth_[a-z_]+)`", line.split("|")[1]))
    return names


def _registry(
    state: NodeSnapshotCache, stream: StreamMetrics | None = None, stats: AgentStats | None = None
) -> CollectorRegistry:
    return make_registry(state.snapshot, "0.1.0", stats or AgentStats(Tasks({})), stream)


def _state(engine: object) -> NodeSnapshotCache:
    return NodeSnapshotCache("node-a", engine, FakeClock())  # type: ignore[arg-type]


DCGM_TEXT = (
    "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
    "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",pci_bus_id="00000000:18:00.0"} 45\n'
)


def _full_stats() -> AgentStats:
    """A running simulator, a crashed kernel-log follower, and every part's counters."""
    parts = every_part()
    stats = AgentStats(
        Tasks(
            {
                "source-sim": {"running": True, "failures": 0},
                "source-kmsg": {"running": False, "failures": 1, "last_error": "boom"},
            }
        )
    )
    stats.add_source(parts.sim, "source-sim")
    stats.add_source(parts.kmsg, "source-kmsg")
    stats.add_source(parts.dcgm, "source-dcgm")  # never ran: not up
    parts.dcgm.parse(DCGM_TEXT)  # its first scrape: the rules it leaves blind are known
    for counters in parts.other_counters():
        stats.add_counters(counters)
    parts.kmsg.counters.inc(KMSG_LINES, 12)
    parts.kmsg.counters.inc(KMSG_MALFORMED, 2)
    parts.kmsg.counters.inc(KMSG_FILE_MISMATCHES, label="inode-reused")
    parts.nvml.counters.inc(NVML_CALL_TIMEOUTS, 4, label="3")
    parts.rdma.counters.inc(RDMA_READ_ERRORS, label="garbage")
    parts.rdma.counters.inc(RDMA_READ_TIMEOUTS, label="mlx5_1")
    parts.sim.polls.observe(0.002)
    stats.unobservable_xids = (79, 119, 120)
    return stats


def test_every_documented_agent_metric_is_exported() -> None:
    engine = engine_with(2)
    engine.stat[0] = status(0, "unhealthy", (XID79,))
    engine.xids[(uuid(0), 79)] = 1
    engine.ops[(uuid(0), "GPU-RAS", 0x30, "MEMORY_INTEGRITY_ERROR", "category")] = 1
    engine.node = [MISSING]
    engine.missing = 1
    engine.nics = [rail()]
    samples = _samples(_state(engine), stats=_full_stats())
    exported = {re.sub(r"_(bucket|sum|count)$", "", n) for n in samples}
    documented = _doc_agent_names()
    assert documented, "docs/metrics.md lost its agent table"
    assert documented - exported == set()
    assert {n for n in exported if n.startswith("gpuhealth_")} - documented == set()


MISSING = Condition(
    reason="GpuMissing",
    code="gpu-missing",
    severity="unhealthy",
    action="RESTART_BM",
    message="7 of 8 expected GPUs visible",
)


def test_missing_gpus_reach_the_node_series() -> None:
    """A GPU gone from the bus has no per-GPU series: the node's own series say so."""
    engine = engine_with(7)
    healthy = _samples(_state(engine))
    assert healthy["gpuhealth_node_gpus_missing"] == [({"node": "node-a"}, 0.0)]
    assert "gpuhealth_node_condition" not in healthy
    engine.node, engine.missing = [MISSING], 1
    samples = _samples(_state(engine))
    assert samples["gpuhealth_node_gpus_missing"] == [({"node": "node-a"}, 1.0)]
    assert samples["gpuhealth_node_condition"] == [
        (
            {
                "node": "node-a",
                "reason": "GpuMissing",
                "code": "gpu-missing",
                "severity": "unhealthy",
                "action": "RESTART_BM",
            },
            1.0,
        )
    ]


def test_per_gpu_labels_unallocated_are_empty() -> None:
    samples = _samples(_state(engine_with(1)))
    labels, value = samples["gpuhealth_gpu_temperature_celsius"][0]
    assert labels == {
        "node": "node-a",
        "gpu": "0",
        "uuid": uuid(0),
        "model": "NVIDIA H100 80GB HBM3",
        "namespace": "",
        "pod": "",
        "container": "",
    }
    assert value == 40.0


@pytest.mark.parametrize(
    ("allocations", "expected_pod"),
    [
        ([alloc(0, "train-0")], "train-0"),
        # time-sliced: two replicas of GPU 0 held by two pods -> the first, sorted
        ([alloc(0, "b-pod", uuid(0) + "::1"), alloc(0, "a-pod", uuid(0) + "::0")], "a-pod"),
        ([alloc(1, "other")], ""),
    ],
)
def test_allocated_gpu_series_carry_pod_labels(allocations: list, expected_pod: str) -> None:
    st = _state(engine_with(1))
    st.set_allocations(allocations)
    for name in ("gpuhealth_gpu_health_state", "gpuhealth_gpu_power_watts", "gpuhealth_gpu_info"):
        for labels, _ in _samples(st)[name]:
            assert labels["pod"] == expected_pod
            assert labels["namespace"] == ("ml" if expected_pod else "")


@pytest.mark.parametrize(
    ("state", "conditions"),
    [("healthy", ()), ("unhealthy", (XID79,)), ("unknown", ())],
)
def test_health_state_one_hot_and_conditions(state: str, conditions: tuple) -> None:
    engine = engine_with(1)
    engine.stat = [status(0, state, conditions)]
    samples = _samples(_state(engine))
    states = {lab["state"]: v for lab, v in samples["gpuhealth_gpu_health_state"]}
    assert states == {s: float(s == state) for s in ("healthy", "degraded", "unhealthy", "unknown")}
    conds = samples.get("gpuhealth_gpu_condition", [])
    assert [(lab["reason"], lab["code"], lab["severity"], lab["action"]) for lab, _ in conds] == [
        (c.reason, c.code, c.severity, c.action) for c in conditions
    ]


@pytest.mark.parametrize(
    ("name", "labels", "value"),
    [
        ("gpuhealth_gpu_ecc_errors_total", {"type": "sbe", "scope": "volatile"}, 3),
        ("gpuhealth_gpu_ecc_errors_total", {"type": "dbe", "scope": "aggregate"}, 1),
        ("gpuhealth_gpu_throttled", {"reason": "power_cap"}, 1),
        ("gpuhealth_gpu_throttled", {"reason": "hw_thermal"}, 0),
        ("gpuhealth_gpu_throttled", {"reason": "vendor_new"}, 1),
        ("gpuhealth_gpu_retired_pages", {"cause": "dbe"}, 1),
        ("gpuhealth_gpu_remapped_rows", {"type": "correctable"}, 4),
        ("gpuhealth_gpu_pcie_replays_total", {}, 7),
        ("gpuhealth_gpu_nvlink_errors_total", {}, 5),
        ("gpuhealth_gpu_memory_total_bytes", {}, 80 * 2**30),
        ("gpuhealth_gpu_row_remap_failure", {}, 0),
        ("gpuhealth_gpu_info", {"driver_version": "580.95.05", "cuda_version": "13.0"}, 1),
        ("gpuhealth_gpu_xid_errors_total", {"xid": "79", "action": "RESTART_BM"}, 2),
    ],
)
def test_sample_values(name: str, labels: dict[str, str], value: float) -> None:
    engine = engine_with(1)
    engine.xids[(uuid(0), 79)] = 2
    found = [
        v
        for lab, v in _samples(_state(engine))[name]
        if all(lab.get(k) == want for k, want in labels.items())
    ]
    assert found == [value]


def test_absent_fields_have_no_series() -> None:
    samples = _samples(_state(engine_with(1, samples=False)))
    assert "gpuhealth_gpu_temperature_celsius" not in samples
    assert "gpuhealth_gpu_throttled" not in samples
    assert len(samples["gpuhealth_gpu_health_state"]) == 4


def test_agent_stats_values() -> None:
    samples = _samples(_state(engine_with(0)), stats=_full_stats())
    up = {lab["source"]: v for lab, v in samples["gpuhealth_agent_source_up"]}
    assert up == {"sim": 1.0, "kmsg": 0.0, "dcgm": 0.0}
    errors = {lab["source"]: v for lab, v in samples["gpuhealth_agent_source_errors_total"]}
    assert errors == {"sim": 0.0, "kmsg": 1.0, "dcgm": 0.0}
    blind = {lab["rule"]: v for lab, v in samples["gpuhealth_agent_rule_blind"]}
    assert blind["thermal"] == 0.0 and blind["ecc-dbe"] == 1.0  # it served GPU_TEMP only
    assert {lab["source"] for lab, _ in samples["gpuhealth_agent_rule_blind"]} == {"dcgm"}
    assert samples["gpuhealth_agent_kmsg_malformed_lines_total"] == [({}, 2.0)]
    assert samples["gpuhealth_agent_nvml_call_timeouts_total"] == [({"gpu": "3"}, 4.0)]
    buckets = dict(
        (lab["le"], v) for lab, v in samples["gpuhealth_agent_poll_duration_seconds_bucket"]
    )
    assert buckets["0.001"] == 0.0 and buckets["0.0025"] == 1.0 and buckets["+Inf"] == 1.0
    assert samples["gpuhealth_agent_build_info"] == [({"version": "0.1.0"}, 1.0)]
    assert samples["gpuhealth_agent_stream_connected"] == [({}, 0.0)]


def test_stream_metrics_come_from_the_stream_client() -> None:
    stream = StreamMetrics(connected=True, outbox_messages=5)
    stream.dropped["heartbeat"] = 2
    samples = _samples(_state(engine_with(0)), stream)
    assert samples["gpuhealth_agent_stream_connected"] == [({}, 1.0)]
    assert samples["gpuhealth_agent_outbox_messages"] == [({}, 5.0)]
    assert samples["gpuhealth_agent_outbox_dropped_total"] == [({"kind": "heartbeat"}, 2.0)]


def test_snapshot_cached_until_dirty() -> None:
    engine = engine_with(2)
    st = _state(engine)
    first = st.snapshot()
    assert st.snapshot() is first and engine.calls == 1
    st.mark_dirty()
    assert st.snapshot() is not first and engine.calls == 2


def test_fast_render_matches_prometheus_client() -> None:
    from prometheus_client import generate_latest

    engine = engine_with(3)
    engine.stat[1] = status(1, "unhealthy", (XID79,))
    engine.xids[(uuid(1), 79)] = 3
    st = _state(engine)
    st.set_allocations([alloc(0, 'we"ird\\pod\nname')])
    stream = StreamMetrics(connected=True)
    stream.dropped["heartbeat"] = 1
    registry = _registry(st, stream, _full_stats())
    fast, reference = render(registry).decode(), generate_latest(registry).decode()

    def parsed(text: str) -> list[tuple[str, str, str, list[tuple[str, dict, float]]]]:
        return [
            (f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
            for f in text_string_to_metric_families(text)
        ]

    assert parsed(fast) == parsed(reference)
    assert sorted(fast.splitlines()) == sorted(reference.splitlines())


def test_stale_samples_are_not_exported() -> None:
    clock = FakeClock()  # starts at AT, the fixtures' sample time
    st = NodeSnapshotCache("n", engine_with(1), clock, sample_max_age_s=120.0)  # type: ignore[arg-type]
    assert "gpuhealth_gpu_temperature_celsius" in _samples(st)
    clock.advance(121.0)
    st.mark_dirty()
    samples = _samples(st)
    assert "gpuhealth_gpu_temperature_celsius" not in samples
    assert len(samples["gpuhealth_gpu_health_state"]) == 4  # the GPU itself is still there


def test_a_nic_port_and_the_gpus_behind_it() -> None:
    engine = engine_with(2)
    engine.nics = [rail()]
    s = _samples(_state(engine))
    base = {"node": "node-a", "device": "mlx5_0", "port": "1", "link_layer": "InfiniBand"}
    assert s["gpuhealth_rdma_port_info"] == [
        ({**base, "model": "MT4129", "netdev": "ib0", "affinity": "PIX"}, 1.0)
    ]
    assert s["gpuhealth_rdma_port_gpu"] == [
        ({"node": "node-a", "device": "mlx5_0", "port": "1", "gpu": str(i), "uuid": uuid(i)}, 1.0)
        for i in (0, 1)
    ]
    assert s["gpuhealth_rdma_port_up"] == [(base, 1.0)]
    assert s["gpuhealth_rdma_port_state"] == [
        ({**base, "port_state": "ACTIVE", "phys_state": "LinkUp"}, 1.0)
    ]
    assert s["gpuhealth_rdma_port_rate_bytes_per_second"] == [(base, 5e10)]
    assert s["gpuhealth_rdma_port_expected_rate_bytes_per_second"] == [(base, 5e10)]
    assert s["gpuhealth_rdma_port_errors_total"] == [
        ({**base, "counter": "link_downed"}, 255.0),
        ({**base, "counter": "symbol_error"}, 17.0),
    ]
    assert s["gpuhealth_rdma_port_counter_saturated"] == [({**base, "counter": "link_downed"}, 1.0)]
    assert s["gpuhealth_rdma_port_flaps_total"] == [(base, 5.0)]
    assert s["gpuhealth_rdma_port_verdict"] == [
        ({**base, "code": "rail-flapping", "severity": "degraded"}, 1.0)
    ]


def test_a_node_without_nics_has_no_port_series() -> None:
    s = _samples(_state(engine_with(2)))
    assert not [n for n in s if n.startswith("gpuhealth_rdma_")]
