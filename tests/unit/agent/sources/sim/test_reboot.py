"""A simulated reboot: a new boot id, the scenario goes on where it was, what a reboot clears
is gone (and nothing already played is observed again)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from gpuhealth.agent.observations import EccObservation, Observation, XidObservation
from gpuhealth.agent.sources.sim.reboot import (
    SimReboot,
    resume_at,
    sim_boot_id,
    write_reboot,
)
from gpuhealth.agent.sources.sim.scenario import Scenario, ScenarioFault
from gpuhealth.agent.sources.sim.source import SIM_FAULTS, SimSource
from gpuhealth.protocol.remediation import RebootOrder
from tests.support.clock import FakeClock

FAULTS = (
    ScenarioFault(at_s=3.0, gpu=1, kind="dbe", value=1),
    ScenarioFault(at_s=3.0, gpu=1, kind="xid", value=79),
    ScenarioFault(at_s=3.0, gpu=1, kind="lost", value=True),
    ScenarioFault(at_s=3.0, gpu=0, kind="row_remap", value="failure"),
    ScenarioFault(at_s=4.0, gpu=0, kind="processes", value=("77",), duration_s=600.0),
    ScenarioFault(at_s=20.0, gpu=0, kind="xid", value=13),
)


def scenario() -> Scenario:
    return Scenario(name="t", gpus=2, poll_interval_s=1.0, duration_s=25.0, faults=FAULTS)


async def play(src: SimSource, clock: FakeClock, seconds: float) -> list[Observation]:
    seen: list[Observation] = []
    task = asyncio.create_task(src.run(seen.append))
    await asyncio.sleep(0)  # started at the clock's current time
    for _ in range(int(seconds)):
        await clock.advance_and_settle(1.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen


def test_no_file_means_the_kernels_boot_and_the_scenario_from_the_start(tmp_path: Path) -> None:
    assert sim_boot_id(tmp_path) is None
    assert resume_at(tmp_path) == 0.0


def test_a_reboot_is_recorded_with_a_new_boot_id_each_time(tmp_path: Path) -> None:
    first = write_reboot(tmp_path, 12.5)
    assert sim_boot_id(tmp_path) == first
    assert resume_at(tmp_path) == 12.5
    second = write_reboot(tmp_path, 30.0)
    assert second != first
    assert (sim_boot_id(tmp_path), resume_at(tmp_path)) == (second, 30.0)


def test_an_unreadable_file_is_no_reboot(tmp_path: Path) -> None:
    (tmp_path / "sim-boot.json").write_text("{not json")
    assert sim_boot_id(tmp_path) is None
    assert resume_at(tmp_path) == 0.0


async def test_after_a_reboot_the_scenario_resumes_and_played_faults_stay_cleared() -> None:
    clock = FakeClock()
    src = SimSource(scenario(), clock, seed=1, resume_at_s=10.0)
    seen = await play(src, clock, 8)
    gpu0, gpu1 = (g.uuid for g in src.inventory().gpus)
    assert not [o for o in seen if isinstance(o, XidObservation | EccObservation)]  # not replayed
    state1 = src.gpu_state(gpu1)
    assert state1 is not None and not state1.lost and state1.dbe == 0
    assert state1.dbe_agg >= 1  # aggregate counts survive a reboot
    state0 = src.gpu_state(gpu0)
    assert state0 is not None and state0.remap_failure  # a failed remap survives too
    assert src.processes(gpu0) == ()  # a reboot ends every process
    assert src.elapsed() == 18.0  # the scenario's time went on from 10 s


async def test_faults_after_the_reboot_point_still_come() -> None:
    clock = FakeClock()
    src = SimSource(scenario(), clock, seed=1, resume_at_s=10.0)
    seen: list[Observation] = []
    task = asyncio.create_task(src.run(seen.append))
    await asyncio.sleep(0)  # started at the clock's current time
    for _ in range(16):
        await clock.advance_and_settle(1.0)
    await asyncio.wait_for(task, 1.0)  # duration 25 s, resumed at 10: ends after 15
    assert [o.xid for o in seen if isinstance(o, XidObservation)] == [13]
    assert src.counters.value(SIM_FAULTS) == 1  # the replayed ones are not counted


async def test_without_a_reboot_every_fault_is_observed() -> None:
    clock = FakeClock()
    src = SimSource(scenario(), clock, seed=1)
    seen = await play(src, clock, 5)
    assert [o.xid for o in seen if isinstance(o, XidObservation)] == [79]
    gpu1 = src.inventory().gpus[1].uuid
    assert src.gpu_state(gpu1) is not None and src.gpu_state(gpu1).lost  # type: ignore[union-attr]


async def test_the_reboot_executor_records_the_reboot_then_restarts_the_agent(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    src = SimSource(scenario(), clock, seed=1)
    task = asyncio.create_task(src.run(lambda _o: None))
    await asyncio.sleep(0)
    for _ in range(7):
        await clock.advance_and_settle(1.0)
    restarted = asyncio.Event()
    order = RebootOrder(
        seq=1,
        order_id="o-1",
        episode="ep",
        issued_at=datetime(2025, 1, 1, tzinfo=UTC),
        deadline_s=60.0,
        expected_boot_id="boot-a",
    )
    outcome = await SimReboot(src, tmp_path, restarted.set).reboot(order, "node-a", "boot-a")
    assert outcome.state == "succeeded"
    assert not restarted.is_set()  # only once the handler has finished with the order
    await asyncio.wait_for(restarted.wait(), 1.0)
    new = sim_boot_id(tmp_path)
    assert new is not None and new != "boot-a"
    assert resume_at(tmp_path) == 7.0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_reboot_that_cannot_be_recorded_fails(tmp_path: Path) -> None:
    src = SimSource(scenario(), FakeClock(), seed=1)
    called: list[bool] = []
    order = RebootOrder(
        seq=1,
        order_id="o-1",
        episode="ep",
        issued_at=datetime(2025, 1, 1, tzinfo=UTC),
        deadline_s=60.0,
        expected_boot_id="boot-a",
    )
    outcome = await SimReboot(src, tmp_path / "missing", lambda: called.append(True)).reboot(
        order, "node-a", "boot-a"
    )
    assert (outcome.state, outcome.reason) == ("failed", "command-failed")
    await asyncio.sleep(0)
    assert called == []
