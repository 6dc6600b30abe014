"""NVML GPU fabric info: membership and health of multi-node NVLink GPUs, NOT_SUPPORTED
elsewhere (a normal answer, asked once), and the verdicts it leads to."""

from __future__ import annotations

import pynvml
import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import FabricInfo, GpuSample
from gpuhealth.agent.sources.nvml.device import NVML_FIELD_ERRORS
from gpuhealth.agent.sources.nvml.fabric_reader import cluster_uuid, decode_health_mask, fabric_info
from tests.fakes.fake_pynvml import FABRIC_HEALTHY_MASK, h100_node, nvl72_tray
from tests.unit.agent.sources.nvml.test_source import running

CLUSTER = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"


@pytest.mark.parametrize(
    ("mask", "flags"),
    [
        (0, set()),
        (FABRIC_HEALTHY_MASK, set()),
        (1 << 0, {"degraded-bandwidth"}),
        (1 << 2, {"route-recovery"}),
        ((1 << 4) | (2 << 0), {"route-unhealthy"}),
        (1 << 6, {"access-timeout-recovery"}),
        ((1 << 0) | (1 << 2) | (1 << 4) | (1 << 6), {
            "degraded-bandwidth", "route-recovery", "route-unhealthy", "access-timeout-recovery"
        }),
        (3 << 0, set()),  # a field value NVML does not define is not a fault
        (1 << 8, set()),  # incorrect-configuration is not a health flag
    ],
)  # fmt: skip
def test_health_mask_decoding(mask: int, flags: set[str]) -> None:
    assert decode_health_mask(mask) == flags


def test_health_mask_shifts_are_nvmls() -> None:
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW == 0
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY == 2
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY == 4
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY == 6
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE == 1


def test_cluster_uuid_is_gfds_form() -> None:
    assert cluster_uuid(bytes.fromhex(CLUSTER.replace("-", ""))) == CLUSTER
    assert cluster_uuid(bytes(16)) == ""
    assert cluster_uuid(b"short") == ""


def test_not_supported_state_is_no_fabric() -> None:
    assert fabric_info(0, bytes(16), 0, 0, 0) is None
    assert fabric_info(9, bytes(16), 0, 0, 0) is None
    f = fabric_info(3, bytes.fromhex(CLUSTER.replace("-", "")), 7, 0, FABRIC_HEALTHY_MASK)
    assert f == FabricInfo(state="completed", cluster_uuid=CLUSTER, clique_id=7)
    assert f.domain == f"{CLUSTER}.7"
    assert FabricInfo(state="in-progress").domain is None


async def test_an_hgx_gpu_reports_no_fabric_and_is_asked_once() -> None:
    fake = h100_node(2)  # fabric state NOT_SUPPORTED, as Hopper HGX answers
    async with running(fake) as r:
        await r.next_poll()
        await r.next_poll()
        assert all(s.fabric is None for s in r.of(GpuSample))  # type: ignore[attr-defined]
        assert fake.gpus[0].calls["nvmlDeviceGetGpuFabricInfoV"] == 1
        assert r.source.counters.value(NVML_FIELD_ERRORS) == 0


async def test_an_old_gpu_answering_not_supported_is_asked_once() -> None:
    fake = h100_node(1)
    fake.gpus[0].unsupported.add("nvmlDeviceGetGpuFabricInfoV")
    async with running(fake) as r:
        await r.next_poll()
        await r.next_poll()
        assert all(s.fabric is None for s in r.of(GpuSample))  # type: ignore[attr-defined]
        assert fake.gpus[0].calls["nvmlDeviceGetGpuFabricInfoV"] == 1
        assert r.source.counters.value(NVML_FIELD_ERRORS) == 0


async def test_an_nvl72_gpu_reports_its_domain_and_health() -> None:
    fake = nvl72_tray(n=2)
    fake.gpus[1].fabric_health_mask = 1 << 4  # route unhealthy
    async with running(fake) as r:
        await r.next_poll()
        by_gpu = {s.uuid: s.fabric for s in r.of(GpuSample)}  # type: ignore[attr-defined]
        f0, f1 = by_gpu[fake.gpus[0].uuid], by_gpu[fake.gpus[1].uuid]
        assert f0 == FabricInfo(state="completed", cluster_uuid=CLUSTER, clique_id=7)
        assert f1 is not None and f1.health == {"route-unhealthy"}
        engine = HealthEngine(HealthSettings(flag_confirm_samples=1), r.clock)
        for o in r.got:
            engine.observe(o)
        st = {s.info.uuid: s for s in engine.statuses()}
        assert st[fake.gpus[0].uuid].state == "healthy"
        assert st[fake.gpus[0].uuid].fabric is not None
        assert st[fake.gpus[0].uuid].fabric.domain == f"{CLUSTER}.7"  # type: ignore[union-attr]
        assert st[fake.gpus[1].uuid].state == "degraded"
        assert {c.code for c in st[fake.gpus[1].uuid].conditions} == {"fabric-degraded"}


async def test_a_fabric_call_error_is_counted_and_asked_again() -> None:
    fake = nvl72_tray(n=1)
    fake.gpus[0].errors["nvmlDeviceGetGpuFabricInfoV"] = pynvml.NVML_ERROR_UNKNOWN
    async with running(fake) as r:
        await r.next_poll()
        await r.next_poll()
        assert all(s.fabric is None for s in r.of(GpuSample))  # type: ignore[attr-defined]
        assert fake.gpus[0].calls["nvmlDeviceGetGpuFabricInfoV"] >= 2
        assert r.source.counters.value(NVML_FIELD_ERRORS) >= 2
