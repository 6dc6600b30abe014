"""Simulator: deterministic telemetry, scenario faults drive the health engine as designed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import GpuSample, Inventory, Observation, PciAddress
from gpuhealth.agent.sources.sim.scenario import Scenario, load_scenario, parse_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from tests.support.clock import FakeClock

DEMO = Path(__file__).parents[5] / "examples" / "scenarios" / "demo.yaml"


def _collect(sim: SimSource, t: float) -> list[Observation]:
    out: list[Observation] = []
    sim.step(t, out.append)
    return out


def test_deterministic_with_seed() -> None:
    a = SimSource(Scenario(gpus=4), FakeClock(), seed=7)
    b = SimSource(Scenario(gpus=4), FakeClock(), seed=7)
    c = SimSource(Scenario(gpus=4), FakeClock(), seed=8)
    assert _collect(a, 0) == _collect(b, 0)
    assert a.inventory() == b.inventory()
    assert a.inventory() != c.inventory()


def test_baseline_is_realistic_h100() -> None:
    sim = SimSource(Scenario(gpus=8), FakeClock(), seed=1)
    samples = [o for o in _collect(sim, 0) if isinstance(o, GpuSample)]
    assert len(samples) == 8
    for s in samples:
        assert s.temperature_c is not None and 30 < s.temperature_c < 80
        assert s.power_w is not None and 50 < s.power_w <= 700
        assert s.utilization_ratio is not None and 0 <= s.utilization_ratio <= 1
        assert s.nvlink_links_up == s.nvlink_links_total == 18
    inv = sim.inventory()
    assert len({g.uuid for g in inv.gpus}) == 8
    assert all(g.pci_bus_id.startswith("00000000:") for g in inv.gpus)
    assert len({PciAddress.parse(g.pci_bus_id) for g in inv.gpus}) == 8


def _play(sc: Scenario, seconds: int) -> HealthEngine:
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    sim = SimSource(sc, clock, seed=42)
    engine.observe(sim.inventory())
    for t in range(seconds + 1):
        sim.step(float(t), engine.observe)
        engine.tick()
        clock.advance(1.0)
    return engine


def test_demo_scenario_verdicts() -> None:
    engine = _play(load_scenario(DEMO), 40)
    by_index = {s.info.index: s for s in engine.statuses()}
    assert by_index[3].state == "unhealthy"
    assert {c.code for c in by_index[3].conditions} == {"xid-79", "gpu-lost"}
    assert by_index[5].state == "unhealthy"
    assert "ecc-dbe" in {c.code for c in by_index[5].conditions}
    assert by_index[2].state == "degraded"
    assert {c.code for c in by_index[2].conditions} == {"thermal"}
    assert by_index[1].state == "healthy"  # XID 13 is counted, never taints
    assert engine.xid_counts()[(by_index[1].info.uuid, 13)] == 1
    assert by_index[6].state == "healthy"
    assert by_index[0].state == "healthy"


def test_hang_then_recovery_and_reboot() -> None:
    sc = parse_scenario(
        "gpus: 2\nevents:\n"
        "  - {at: 2, gpu: 0, hang: true, for: 5}\n"
        "  - {at: 3, gpu: 1, row_remap: pending}\n"
        "  - {at: 60, gpu: all, reset: true}\n"
    )
    engine = _play(sc, 4)
    assert [s.state for s in engine.statuses()] == ["unhealthy", "degraded"]
    engine = _play(sc, 61)
    assert [s.state for s in engine.statuses()] == ["healthy", "healthy"]


def test_missing_gpu_leaves_inventory() -> None:
    sc = parse_scenario("gpus: 3\nevents:\n  - {at: 1, gpu: 2, missing: true}\n")
    engine = _play(sc, 2)
    assert [s.state for s in engine.statuses()] == ["healthy", "healthy", "unhealthy"]


async def test_run_on_fake_clock_ends_after_duration() -> None:
    clock = FakeClock()
    sim = SimSource(Scenario(gpus=2, duration_s=3.0), clock, seed=0)
    got: list[Observation] = []
    task = asyncio.create_task(sim.run(got.append))
    for _ in range(5):
        await clock.advance_and_settle(1.0)
    await asyncio.wait_for(task, 1.0)
    assert isinstance(got[0], Inventory)
    assert sim.polls.count == 4  # each poll's duration is in the histogram
    assert sum(isinstance(o, GpuSample) for o in got) == 8


async def test_the_first_inventory_can_come_late() -> None:
    """As NVML's without persistence mode: nothing is observed before inventory_delay_s."""
    clock = FakeClock()
    sim = SimSource(Scenario(gpus=2, inventory_delay_s=5.0, duration_s=5.0), clock, seed=0)
    got: list[Observation] = []
    task = asyncio.create_task(sim.run(got.append))
    await clock.advance_and_settle(0.0)  # the simulator starts and waits
    await clock.advance_and_settle(4.0)
    assert got == []
    await clock.advance_and_settle(1.0)
    assert isinstance(got[0], Inventory)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_the_scenario_file_reads_the_inventory_delay() -> None:
    assert parse_scenario("inventory_delay_s: 2m\n", "s.yaml").inventory_delay_s == 120.0
