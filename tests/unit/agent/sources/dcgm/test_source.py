"""dcgm-exporter source against a real aiohttp server on 127.0.0.1 serving dcgm-exporter text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import GpuSample, Inventory, Observation, XidObservation
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.dcgm.source import DCGM_SCRAPES, DcgmExporterSource
from tests.support.clock import FakeClock
from tests.support.wait import until

U0 = "GPU-5a8b0c1d-0000-4000-8000-000000000000"
U1 = "GPU-5a8b0c1d-1111-4000-8000-000000000001"


def exposition(xid1: int = 0, dbe1: int = 0, temp0: int = 45) -> str:
    """Text as dcgm-exporter 3.x/4.x writes it (default counters plus the reliability set)."""
    rows: list[str] = []

    def fam(name: str, kind: str, help_: str, values: tuple[float, float], extra: str = "") -> None:
        rows.append(f"# HELP {name} {help_}")
        rows.append(f"# TYPE {name} {kind}")
        for i, (u, v) in enumerate(zip((U0, U1), values, strict=True)):
            labels = (
                f'gpu="{i}",UUID="{u}",pci_bus_id="00000000:{0x18 + 0x11 * i:02X}:00.0",'
                f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",'
                'DCGM_FI_DRIVER_VERSION="570.133.20"'
            )
            if extra and i == 1:
                labels += extra
            if extra and i == 0:
                labels += ',err_code="0",err_msg="No Error"'
            rows.append(f"{name}{{{labels}}} {v:g}")

    fam("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", (1980, 1755))
    fam("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", (2619, 2619))
    fam("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", (52, 50))
    fam("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", (temp0, 41))
    fam("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", (351.25, 98.5))
    fam("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy (in mJ).", (1e9, 2e9))
    fam("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", (0, 3))
    fam("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", (87, 0))
    fam("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", (41, 0))
    fam("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", (0, 0))
    fam("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", (60000, 81000))
    fam("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", (21559, 559))
    fam(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        (4, 0),
    )
    fam(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        (0, dbe1),
    )
    fam(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        (9, 1),
    )
    fam(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        (0, dbe1),
    )
    fam(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        (0, 0),
    )
    fam(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        (2, 0),
    )
    fam("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", (0, 0))
    fam(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "NVLink flow-control CRC errors.",
        (1, 0),
    )
    fam(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "NVLink data CRC errors.",
        (2, 0),
    )
    fam("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink retries.", (3, 0))
    fam(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "NVLink recovery errors.",
        (4, 0),
    )
    fam("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Throttle reasons bitmask.", (0x44, 0x1))
    fam(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        (0, xid1),
        extra=f',err_code="{xid1}",err_msg="Graphics Engine Exception"'
        if xid1
        else ',err_code="0",err_msg="No Error"',
    )
    return "\n".join(rows) + "\n"


class Exporter:
    def __init__(self) -> None:
        self.body = exposition()
        self.status = 200
        self.hits = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text=self.body, status=self.status, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[Exporter, str]]:
    exp = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", exp.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield exp, f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


async def test_scrape_maps_fields(exporter: tuple[Exporter, str]) -> None:
    _, url = exporter
    clock = FakeClock()
    src = DcgmExporterSource(url, DcgmSettings(), clock)
    got: list[Observation] = []
    task = asyncio.create_task(src.run(got.append))
    try:
        await until(lambda: src.counters.value(DCGM_SCRAPES) == 1)
    finally:
        task.cancel()
    inv = got[0]
    assert isinstance(inv, Inventory)
    assert [(g.index, g.uuid, g.pci_bus_id) for g in inv.gpus] == [
        (0, U0, "00000000:18:00.0"),
        (1, U1, "00000000:29:00.0"),
    ]
    assert inv.gpus[0].model == "NVIDIA H100 80GB HBM3" and inv.driver_version == "570.133.20"
    s0 = next(o for o in got if isinstance(o, GpuSample) and o.uuid == U0)
    assert (s0.temperature_c, s0.memory_temperature_c, s0.power_w) == (45, 52, 351.25)
    assert (s0.utilization_ratio, s0.memory_utilization_ratio) == (0.87, 0.41)
    assert (s0.sm_clock_hz, s0.memory_clock_hz) == (1.98e9, 2.619e9)
    assert s0.memory_used_bytes == 21559 * 1024 * 1024
    assert s0.memory_total_bytes == (21559 + 60000) * 1024 * 1024
    assert (
        s0.ecc_sbe_volatile,
        s0.ecc_dbe_volatile,
        s0.ecc_sbe_aggregate,
        s0.ecc_dbe_aggregate,
    ) == (4, 0, 9, 0)
    assert (s0.remapped_rows_correctable, s0.remapped_rows_uncorrectable, s0.row_remap_failure) == (
        2,
        0,
        False,
    )
    assert s0.nvlink_errors == 10 and s0.pcie_replay_count == 0
    assert s0.throttle_reasons == frozenset({"power_cap", "hw_thermal"})
    assert not any(isinstance(o, XidObservation) for o in got)
    assert src.up


async def test_new_xid_and_dbe_drive_health(exporter: tuple[Exporter, str]) -> None:
    exp, url = exporter
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    src = DcgmExporterSource(url, DcgmSettings(scrape_interval_s=10), clock)
    got: list[Observation] = []

    def sink(o: Observation) -> None:
        got.append(o)
        engine.observe(o)

    task = asyncio.create_task(src.run(sink))
    try:
        await until(lambda: src.counters.value(DCGM_SCRAPES) == 1)
        exp.body = exposition(xid1=79, dbe1=1)
        await clock.advance_and_settle(10)
        await until(lambda: src.counters.value(DCGM_SCRAPES) == 2)
        await clock.advance_and_settle(10)  # the same last XID again: not a new one
        await until(lambda: src.counters.value(DCGM_SCRAPES) == 3)
    finally:
        task.cancel()
    xids = [o for o in got if isinstance(o, XidObservation)]
    assert [(x.xid, x.uuid, x.source) for x in xids] == [(79, U1, "dcgm")]
    st = {s.info.uuid: s for s in engine.statuses()}
    assert st[U1].state == "unhealthy"
    assert {c.code for c in st[U1].conditions} == {"xid-79", "ecc-dbe"}
    assert st[U0].state == "healthy"
    assert sum(isinstance(o, Inventory) for o in got) == 1  # unchanged inventory is sent once


async def test_failed_scrape_is_counted_and_retried(exporter: tuple[Exporter, str]) -> None:
    exp, url = exporter
    clock = FakeClock()
    src = DcgmExporterSource(url, DcgmSettings(scrape_interval_s=5), clock)
    exp.status = 503
    task = asyncio.create_task(src.run(lambda _: None))
    try:
        await until(lambda: src.errors == 1)
        assert not src.up
        exp.status = 200
        await clock.advance_and_settle(5)
        await until(lambda: src.counters.value(DCGM_SCRAPES) == 1)
        assert src.up
    finally:
        task.cancel()


async def test_unreachable_endpoint_never_raises() -> None:
    src = DcgmExporterSource("http://127.0.0.1:9/metrics", DcgmSettings(timeout_s=0.5), FakeClock())
    task = asyncio.create_task(src.run(lambda _: None))
    try:
        await until(lambda: src.errors == 1)
        assert not task.done()
    finally:
        task.cancel()


def test_garbage_text_is_a_value_error() -> None:
    src = DcgmExporterSource("http://x", DcgmSettings(), FakeClock())
    with pytest.raises(ValueError):
        src.parse('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1" 45\n')
