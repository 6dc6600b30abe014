"""NVML source against the fake NVML module: fields, NOT_SUPPORTED, hangs, lost, missing, events."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pynvml
import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import (
    EccObservation,
    GpuSample,
    Inventory,
    LivenessObservation,
    Observation,
    XidObservation,
)
from gpuhealth.agent.sources.nvml.device import NVML_FIELD_ERRORS
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.sources.nvml.source import NVML_CALL_TIMEOUTS, NVML_EVENTS, NvmlSource
from gpuhealth.common.errors import TransientError
from tests.fakes.fake_pynvml import FakeNvml, h100_node
from tests.support.clock import FakeClock
from tests.support.wait import until


class Run:
    def __init__(self, fake: FakeNvml, **settings: object) -> None:
        self.clock = FakeClock()
        self.fake = fake
        self.source = NvmlSource(
            NvmlSettings(**{"call_deadline_s": 0.2, "event_wait_ms": 20, **settings}),  # type: ignore[arg-type]
            self.clock,
            nvml_module=fake,
        )
        self.got: list[Observation] = []

    def of(self, kind: type) -> list[object]:
        return [o for o in self.got if isinstance(o, kind)]

    async def next_poll(self) -> None:
        n = self.source.polls.count
        await self.clock.advance_and_settle(1.0)
        await until(lambda: self.source.polls.count > n)


@asynccontextmanager
async def running(fake: FakeNvml, **settings: object) -> AsyncIterator[Run]:
    r = Run(fake, **settings)
    task = asyncio.create_task(r.source.run(r.got.append))
    try:
        await until(lambda: r.source.polls.count >= 1 or task.done())
        if task.done():
            task.result()
        yield r
    finally:
        for g in fake.gpus:
            if g.hang is not None:
                g.hang.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_inventory_and_all_fields() -> None:
    fake = h100_node(2)
    g = fake.gpus[0]
    g.clocks_event_mask = (
        pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    )
    g.sbe_volatile, g.dbe_volatile, g.sbe_aggregate, g.dbe_aggregate = 5, 1, 7, 2
    g.remapped = (3, 1, 1, 0)
    g.pcie_replays = 9
    g.nvlink_states[4] = 0
    g.nvlink_error_per_counter = 2
    g.process_util = [(4242, 55)]
    async with running(fake) as r:
        (inv,) = r.of(Inventory)
        assert isinstance(inv, Inventory)
        assert inv.driver_version == "570.133.20" and inv.cuda_version == "12.8"
        ident = inv.gpus[0]
        assert (ident.uuid, ident.pci_bus_id, ident.model) == (g.uuid, "00000000:18:00.0", g.name)
        assert ident.memory_total_bytes == g.memory_total and not ident.mig_enabled
        s = r.of(GpuSample)[0]
        assert isinstance(s, GpuSample) and s.uuid == g.uuid
        assert (s.temperature_c, s.memory_temperature_c) == (45.0, 50.0)
        assert (s.slowdown_temperature_c, s.shutdown_temperature_c) == (89.0, 92.0)
        assert (s.power_w, s.power_limit_w) == (350.0, 700.0)
        assert (s.utilization_ratio, s.memory_utilization_ratio) == (0.7, 0.4)
        assert s.memory_used_bytes == g.memory_used
        assert (s.sm_clock_hz, s.memory_clock_hz) == (1.98e9, 2.619e9)
        assert s.throttle_reasons == frozenset({"hw_thermal", "power_cap"})
        assert (
            s.ecc_sbe_volatile,
            s.ecc_dbe_volatile,
            s.ecc_sbe_aggregate,
            s.ecc_dbe_aggregate,
        ) == (5, 1, 7, 2)
        assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable) == (3, 1)
        assert s.row_remap_pending is True and s.row_remap_failure is False
        assert s.pcie_replay_count == 9
        assert (s.nvlink_links_up, s.nvlink_links_total, s.nvlink_errors) == (17, 18, 17 * 4 * 2)
        assert s.fan_speed_ratio is None  # NOT_SUPPORTED on SXM boards: absent
        assert s.retired_pages_pending is None and s.retired_pages_sbe is None
        assert s.performance_state == 0 and s.mig_mode is False and s.mig_instances == 0
        assert s.process_utilization == {4242: 0.55}
        assert r.source.inventory is not None
        assert r.source.inventory.gpus[0].pci_bus_id == "00000000:18:00.0"
        assert r.source.last_poll_duration_s > 0 and r.source.up


async def test_not_supported_is_absent_and_not_asked_again() -> None:
    fake = h100_node(1)
    fake.gpus[0].unsupported |= {"nvmlDeviceGetPcieReplayCounter"}
    async with running(fake) as r:
        await r.next_poll()
        await r.next_poll()
        assert all(
            isinstance(s, GpuSample) and s.pcie_replay_count is None for s in r.of(GpuSample)
        )
        assert fake.gpus[0].calls["nvmlDeviceGetPcieReplayCounter"] == 1
        assert fake.gpus[0].calls["nvmlDeviceGetTemperature"] == 3
        assert r.source.counters.value(NVML_FIELD_ERRORS) == 0


async def test_hung_gpu_is_unresponsive_and_does_not_stall_others() -> None:
    fake = h100_node(3)
    async with running(fake) as r:
        hang = threading.Event()
        fake.gpus[1].hang = hang
        before = len(r.of(GpuSample))
        await r.next_poll()
        assert r.source.last_poll_duration_s < 1.0
        samples = {s.uuid for s in r.of(GpuSample)[before:]}  # type: ignore[attr-defined]
        assert samples == {fake.gpus[0].uuid, fake.gpus[2].uuid}
        (unresp,) = r.of(LivenessObservation)
        assert isinstance(unresp, LivenessObservation)
        assert (unresp.kind, unresp.uuid) == ("unresponsive", fake.gpus[1].uuid)
        assert r.source.counters.by_label(NVML_CALL_TIMEOUTS) == {"1": 1}
        calls = sum(fake.gpus[1].calls.values())
        await r.next_poll()  # still hung: reported again, but not asked again
        assert sum(fake.gpus[1].calls.values()) == calls
        assert [o.kind for o in r.of(LivenessObservation)] == ["unresponsive", "unresponsive"]  # type: ignore[attr-defined]
        assert r.source.last_poll_duration_s < 0.1
        hang.set()
        fake.gpus[1].hang = None
        await until(
            lambda: r.source._gpus[1].pending is not None and r.source._gpus[1].pending.done()
        )
        await r.next_poll()
        kinds = [o.kind for o in r.of(LivenessObservation)]  # type: ignore[attr-defined]
        assert kinds[-1] == "responsive"
        assert r.of(GpuSample)[-1].uuid in {g.uuid for g in fake.gpus}  # type: ignore[attr-defined]


async def test_gpu_is_lost() -> None:
    fake = h100_node(2)
    async with running(fake) as r:
        fake.gpus[0].lost = True
        await r.next_poll()
        lost = [o for o in r.of(LivenessObservation) if o.kind == "lost"]  # type: ignore[attr-defined]
        assert [o.uuid for o in lost] == [fake.gpus[0].uuid]  # type: ignore[attr-defined]


async def test_fewer_gpus_than_expected_is_missing() -> None:
    fake = h100_node(4)
    fake.visible = 3
    async with running(fake, expected_gpus=4) as r:
        missing = [o for o in r.of(LivenessObservation) if o.kind == "missing"]  # type: ignore[attr-defined]
        assert missing and "3 of 4" in missing[0].detail  # type: ignore[attr-defined]


async def test_count_dropping_after_start_is_missing() -> None:
    fake = h100_node(2)
    async with running(fake) as r:
        assert not r.of(LivenessObservation)
        fake.visible = 1
        await r.next_poll()
        assert [o.kind for o in r.of(LivenessObservation)] == ["missing"]  # type: ignore[attr-defined]


async def test_xid_and_dbe_events_reach_the_health_engine() -> None:
    fake = h100_node(2)
    async with running(fake) as r:
        engine = HealthEngine(HealthSettings(), r.clock)
        for o in r.got:
            engine.observe(o)
        fake.inject_xid(1, 79)
        fake.inject_event(0, pynvml.nvmlEventTypeDoubleBitEccError)
        await until(lambda: bool(r.of(XidObservation)) and bool(r.of(EccObservation)))
        (x,) = r.of(XidObservation)
        assert isinstance(x, XidObservation)
        assert (x.xid, x.uuid, x.source, str(x.pci)) == (
            79,
            fake.gpus[1].uuid,
            "nvml",
            "0000:29:00.0",
        )
        for o in r.got:
            engine.observe(o)
        states = {s.info.uuid: s.state for s in engine.statuses()}
        assert states == {fake.gpus[0].uuid: "unhealthy", fake.gpus[1].uuid: "unhealthy"}
        assert r.source.counters.value(NVML_EVENTS) == 2


async def test_init_failure_is_a_transient_error() -> None:
    fake = h100_node(1)

    def broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = broken  # type: ignore[method-assign]
    src = NvmlSource(NvmlSettings(), FakeClock(), nvml_module=fake)
    with pytest.raises(TransientError, match="Driver Not Loaded"):
        await src.run(lambda _: None)
    assert not src.up


def test_fake_raises_real_pynvml_error_classes() -> None:
    fake = h100_node(1)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetFanSpeed(h)
    fake.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as exc:
        fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert exc.value.value == 15


async def test_gpu_lost_at_start_does_not_hide_the_others() -> None:
    fake = h100_node(3)
    fake.gpus[1].lost = True
    async with running(fake) as r:
        (inv,) = r.of(Inventory)
        assert [g.index for g in inv.gpus] == [0, 2]  # type: ignore[attr-defined]
        kinds = {o.kind for o in r.of(LivenessObservation)}  # type: ignore[attr-defined]
        assert kinds == {"missing"}  # reported at start and on every poll
        assert {s.uuid for s in r.of(GpuSample)} == {fake.gpus[0].uuid, fake.gpus[2].uuid}  # type: ignore[attr-defined]


async def test_old_driver_throttle_reasons_fallback() -> None:
    fake = h100_node(1)
    fake.gpus[0].unsupported.add("nvmlDeviceGetCurrentClocksEventReasons")
    fake.gpus[0].clocks_event_mask = pynvml.nvmlClocksThrottleReasonHwSlowdown
    async with running(fake) as r:
        await r.next_poll()
        samples = r.of(GpuSample)
        assert all(s.throttle_reasons == frozenset({"hw_slowdown"}) for s in samples)  # type: ignore[attr-defined]
        assert fake.gpus[0].calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1


async def test_missing_gpu_coming_back_clears_the_node_condition() -> None:
    fake = h100_node(2)
    async with running(fake) as r:
        engine = HealthEngine(HealthSettings(), r.clock)
        fake.visible = 1
        await r.next_poll()
        for o in r.got:
            engine.observe(o)
        assert [c.code for c in engine.node_conditions()] == ["gpu-missing"]
        fake.visible = 2
        n = len(r.got)
        await r.next_poll()
        for o in r.got[n:]:
            engine.observe(o)
        assert engine.node_conditions() == []


async def test_without_an_injected_module_every_call_goes_to_pynvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the agent runs in production: no ``nvml_module``, the bindings are imported. Seen on
    a real H100: the per-GPU reader was given the (absent) injected module instead of the
    bindings, so every start crashed with ``'NoneType' object has no attribute
    'nvmlDeviceGetHandleByIndex'`` while every test (all injecting a fake) passed."""
    import sys

    fake = h100_node(2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    src = NvmlSource(NvmlSettings(call_deadline_s=0.2, event_wait_ms=20), FakeClock())
    got: list[Observation] = []
    task = asyncio.create_task(src.run(got.append))
    try:
        await until(lambda: src.polls.count >= 1 or task.done())
        if task.done():
            task.result()
        (inv,) = [o for o in got if isinstance(o, Inventory)]
        assert [g.uuid for g in inv.gpus] == [g.uuid for g in fake.gpus]
        assert {o.uuid for o in got if isinstance(o, GpuSample)} == {g.uuid for g in fake.gpus}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
