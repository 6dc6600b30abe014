"""One dcgm-exporter scrape -> one value per GPU: copies per pod and per MIG instance."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.health.rules import VERDICTS
from gpuhealth.agent.observations import GpuInstanceSample
from gpuhealth.agent.sources.dcgm.fields import FIELDS, NOT_FROM_DCGM, RULE_FIELDS, blind_rules
from gpuhealth.agent.sources.dcgm.parse import gpu_sample, gpu_xids, parse_exposition
from tests.support.dcgm_exposition import Gpu, Instance, gpu, render

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
MIB = 1024 * 1024
PODS = [("ml", f"train-{i}", "main") for i in range(4)]
NVLINK_5 = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 1,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 1,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 2,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 1,
}


def _samples(text: str) -> dict[str, object]:
    scrape = parse_exposition(text)
    return {u: gpu_sample(g, AT) for u, g in scrape.gpus.items()}


def test_plain_node_maps_every_field() -> None:
    g0 = gpu(0, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=0x44, DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=4)
    g1 = gpu(1, DCGM_FI_DEV_ROW_REMAP_PENDING=1, **NVLINK_5)
    scrape = parse_exposition(render([g0, g1]))
    assert scrape.copies == 0 and scrape.driver_version == "570.133.20"
    assert [(g.identity.index, g.identity.pci_bus_id) for g in scrape.gpus.values()] == [
        (0, "00000000:18:00.0"),
        (1, "00000000:29:00.0"),
    ]
    s0 = gpu_sample(scrape.gpus[g0.uuid], AT)
    assert (s0.temperature_c, s0.slowdown_temperature_c, s0.power_w) == (45, 87, 351.25)
    assert (s0.utilization_ratio, s0.sm_clock_hz) == (0.87, 1.98e9)
    assert (s0.memory_used_bytes, s0.memory_total_bytes) == (21559 * MIB, 81559 * MIB)
    assert s0.throttle_reasons == frozenset({"power_cap", "hw_thermal"})
    assert s0.ecc_sbe_volatile == 4 and s0.nvlink_errors == 0 and s0.mig_mode is None
    s1 = gpu_sample(scrape.gpus[g1.uuid], AT)
    assert s1.row_remap_pending is True and s1.nvlink_errors == 5
    assert blind_rules(scrape.fields_seen) == {}


@pytest.mark.parametrize("old_namespace", [False, True])
@pytest.mark.parametrize("hostname", ["Hostname", "hostname"])
def test_a_gpu_shared_by_four_pods_counts_once(old_namespace: bool, hostname: str) -> None:
    """Time-slicing: dcgm-exporter repeats each series per pod; 5 NVLink errors stay 5."""
    shared = gpu(0, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=1, DCGM_FI_DEV_PCIE_REPLAY_COUNTER=7, **NVLINK_5)
    shared.pods = PODS
    alone = gpu(1)
    text = render([shared, alone], old_namespace=old_namespace, hostname=hostname)
    assert text.count('DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{gpu="0"') == 4
    scrape = parse_exposition(text)
    s = gpu_sample(scrape.gpus[shared.uuid], AT)
    assert (s.nvlink_errors, s.ecc_dbe_volatile, s.pcie_replay_count) == (5, 1, 7)
    assert s.utilization_ratio == 0.87 and s.memory_used_bytes == 21559 * MIB
    read = sum(f'\n{name}{{gpu="0"' in text for name in FIELDS)
    assert scrape.copies == 3 * read  # three extra pods, every field the agent reads
    assert gpu_sample(scrape.gpus[alone.uuid], AT).nvlink_errors == 0


def test_per_process_copies_do_not_replace_the_gpu_value() -> None:
    """dcgm-exporter's per-process mode: GPU_UTIL and FB_USED once for the GPU (no pod) and
    once per pod with that pod's share; the GPU's own series wins."""
    g = gpu(0, DCGM_FI_DEV_GPU_UTIL=90, DCGM_FI_DEV_FB_USED=30000)
    text = render([g])
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",'
        'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",'
        'DCGM_FI_DRIVER_VERSION="570.133.20",container="main",namespace="ml",'
        f'pod="{pod}",pod_uid="u-{pod}"}} {v}'
        for pod, v in (("a", 30), ("b", 60), ("c", 95))
    ]
    head, _, tail = text.partition("# HELP DCGM_FI_DEV_MEM_COPY_UTIL")
    text = head + "\n".join(lines) + "\n# HELP DCGM_FI_DEV_MEM_COPY_UTIL" + tail
    s = gpu_sample(parse_exposition(text).gpus[g.uuid], AT)
    assert s.utilization_ratio == 0.9


def _mig_gpu() -> Gpu:
    g = gpu(0, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2, DCGM_FI_DEV_XID_ERRORS=0, **NVLINK_5)
    for k in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        del g.values[k]  # not reported for the whole GPU in MIG mode
    g.instances = [
        Instance(
            1,
            "3g.40gb",
            {
                "DCGM_FI_DEV_FB_USED": 1000,
                "DCGM_FI_DEV_FB_FREE": 39000,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.6,
            },
        ),
        Instance(
            2,
            "4g.40gb",
            {
                "DCGM_FI_DEV_FB_USED": 3000,
                "DCGM_FI_DEV_FB_FREE": 37000,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.25,
            },
        ),
    ]
    return g


def test_mig_instances_are_kept_apart_and_device_fields_counted_once() -> None:
    g = _mig_gpu()
    text = render([g, gpu(1)])
    assert text.count('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"') == 3  # the GPU and 2 instances
    scrape = parse_exposition(text)
    mig = scrape.gpus[g.uuid]
    assert mig.identity.mig_enabled and not scrape.gpus[gpu(1).uuid].identity.mig_enabled
    s = gpu_sample(mig, AT)
    assert (s.ecc_dbe_volatile, s.nvlink_errors) == (2, 5)
    assert (s.mig_mode, s.mig_instances) == (True, 2)
    assert s.memory_used_bytes == 4000 * MIB and s.memory_total_bytes == 80000 * MIB
    assert s.utilization_ratio == pytest.approx((0.6 * 3 + 0.25 * 4) / 7)
    assert s.gpu_instances == (
        GpuInstanceSample(1, "3g.40gb", 1000 * MIB, 40000 * MIB, 0.6),
        GpuInstanceSample(2, "4g.40gb", 3000 * MIB, 40000 * MIB, 0.25),
    )
    assert gpu_xids(mig) == {None: (0, "No Error"), 1: (0, "No Error"), 2: (0, "No Error")}


def test_xid_value_and_message() -> None:
    g = gpu(0, DCGM_FI_DEV_XID_ERRORS=79)
    g.pods = PODS
    scrape = parse_exposition(render([g]))
    assert gpu_xids(scrape.gpus[g.uuid]) == {None: (79, "GPU has fallen off the bus")}


def test_a_field_not_served_is_absent_not_zero() -> None:
    text = render([gpu(0)], fields=["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"])
    scrape = parse_exposition(text)
    s = gpu_sample(scrape.gpus[gpu(0).uuid], AT)
    assert s.temperature_c == 45 and s.nvlink_errors is None and s.ecc_dbe_volatile is None
    assert gpu_xids(scrape.gpus[gpu(0).uuid]) == {}


def test_dcgm_blank_sentinels_are_no_value() -> None:
    """Older exporters print DCGM's int64 "not supported" value instead of leaving it out."""
    text = render([gpu(0)], fields=["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"])
    text = text.replace('"} 52', '"} 9223372036854775794')
    scrape = parse_exposition(text)
    assert gpu_sample(scrape.gpus[gpu(0).uuid], AT).memory_temperature_c is None
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in scrape.fields_seen


STOCK_DEFAULT_COUNTERS = [
    # the fields dcgm-exporter's etc/default-counters.csv serves (the rest are commented out)
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
]  # fmt: skip


def test_stock_counters_leave_most_rules_blind() -> None:
    scrape = parse_exposition(render([gpu(0)], fields=STOCK_DEFAULT_COUNTERS))
    assert set(blind_rules(scrape.fields_seen)) == {
        "thermal-throttle",
        "ecc-sbe-rate",
        "ecc-dbe",
        "row-remap-pending",
        "retired-pages-pending",
        "nvlink-errors",
    }


def test_rule_fields_are_fields_the_source_reads() -> None:
    assert {f for fields in RULE_FIELDS.values() for f in fields} <= set(FIELDS)


def test_every_verdict_is_fed_by_dcgm_or_says_why_not() -> None:
    judged = (set(RULE_FIELDS) | set(NOT_FROM_DCGM)) - {"xid", "idle"}
    assert judged == set(VERDICTS)
    assert not set(RULE_FIELDS) & set(NOT_FROM_DCGM)


def test_garbage_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_exposition('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1" 45\n')


# -- fuzz --------------------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=50)
fleet = st.lists(
    st.fixed_dictionaries(
        {
            "temp": st.integers(min_value=20, max_value=95),
            "dbe": counts,
            "nvlink": st.lists(counts, min_size=4, max_size=4),
            "pods": st.integers(min_value=0, max_value=6),
            "xid": st.sampled_from([0, 13, 48, 79]),
        }
    ),
    min_size=1,
    max_size=4,
)


def _fleet(spec: list[dict[str, object]]) -> list[Gpu]:
    gpus = []
    for i, d in enumerate(spec):
        nv = dict(zip(NVLINK_5, d["nvlink"], strict=True))  # type: ignore[call-overload]
        g = gpu(
            i,
            DCGM_FI_DEV_GPU_TEMP=d["temp"],  # type: ignore[arg-type]
            DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=d["dbe"],  # type: ignore[arg-type]
            DCGM_FI_DEV_XID_ERRORS=d["xid"],  # type: ignore[arg-type]
            **nv,
        )
        g.pods = [("ns", f"p{k}", "c") for k in range(d["pods"])]  # type: ignore[call-overload]
        gpus.append(g)
    return gpus


@settings(max_examples=60, deadline=None)
@given(fleet)
def test_pod_copies_never_change_a_gpu(spec: list[dict[str, object]]) -> None:
    """Any number of pods per GPU gives the same samples and XIDs as none."""
    shared = _fleet(spec)
    plain = copy.deepcopy(shared)
    for g in plain:
        g.pods = []
    a, b = parse_exposition(render(shared)), parse_exposition(render(plain))
    assert {u: gpu_sample(g, AT) for u, g in a.gpus.items()} == {
        u: gpu_sample(g, AT) for u, g in b.gpus.items()
    }
    assert {u: gpu_xids(g) for u, g in a.gpus.items()} == {
        u: gpu_xids(g) for u, g in b.gpus.items()
    }
    for g, d in zip(shared, spec, strict=True):
        s = gpu_sample(a.gpus[g.uuid], AT)
        assert s.nvlink_errors == sum(d["nvlink"])  # type: ignore[call-overload]
        assert s.ecc_dbe_volatile == d["dbe"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_or_is_a_value_error(text: str) -> None:
    try:
        scrape = parse_exposition(text)
    except ValueError:
        return
    for g in scrape.gpus.values():
        gpu_sample(g, AT)
        gpu_xids(g)


line_parts = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        '{UUID="GPU-1",gpu="0"}',
        '{UUID="GPU-1",gpu="x",GPU_I_ID="2",GPU_I_PROFILE="1g.10gb",pod="p"}',
        '{uuid="GPU-2",GPU_I_ID="",pod=""}',
        " 45",
        " NaN",
        " -1e300",
        " 9223372036854775794",
        " +Inf",
        "\n",
        "# TYPE DCGM_FI_DEV_GPU_TEMP counter\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(line_parts, max_size=30).map("".join))
def test_near_valid_text_parses_or_is_a_value_error(text: str) -> None:
    try:
        scrape = parse_exposition(text)
    except ValueError:
        return
    for g in scrape.gpus.values():
        gpu_sample(g, AT)
        gpu_xids(g)
