"""The simulator behind NVML and the reset command: the remediation executors' view of it."""

from __future__ import annotations

import pytest

from gpuhealth.agent.remediation.nvml_probe import NvmlProbe, UnknownGpu
from gpuhealth.agent.remediation.reset import GpuResetter
from gpuhealth.agent.remediation.settings import ResetCommandSettings
from gpuhealth.agent.sources.sim.nvml import SimNvml, sim_reset_command
from gpuhealth.agent.sources.sim.scenario import Scenario, ScenarioFault
from gpuhealth.agent.sources.sim.source import SimSource
from tests.support.clock import FakeClock


def sim(*faults: ScenarioFault) -> SimSource:
    src = SimSource(Scenario(name="t", gpus=2, faults=tuple(faults)), FakeClock(), seed=1)
    src.step(0.0, lambda _obs: None)
    return src


def dbe(gpu: int) -> ScenarioFault:
    return ScenarioFault(at_s=0.0, gpu=gpu, kind="dbe", value=1)


async def test_a_reset_clears_what_a_reset_clears_and_tells_the_engine() -> None:
    src = sim(dbe(1))
    gpu = src.inventory().gpus[1].uuid
    assert src.gpu_state(gpu).dbe == 1  # type: ignore[union-attr]
    told: list[str] = []
    resetter = GpuResetter(
        NvmlProbe(SimNvml(src), 1.0),
        ResetCommandSettings(),
        on_reset=told.append,
        run=sim_reset_command(src),
    )
    outcome = await resetter.reset([gpu])
    assert outcome.state == "succeeded", outcome
    assert src.gpu_state(gpu).dbe == 0  # type: ignore[union-attr]
    assert told == [gpu]


async def test_a_busy_gpu_is_refused_with_its_processes() -> None:
    busy = ScenarioFault(at_s=0.0, gpu=0, kind="processes", value=("4242",), duration_s=60.0)
    src = sim(busy, dbe(0))
    gpu = src.inventory().gpus[0].uuid
    resetter = GpuResetter(
        NvmlProbe(SimNvml(src), 1.0), ResetCommandSettings(), run=sim_reset_command(src)
    )
    outcome = await resetter.reset([gpu])
    assert (outcome.state, outcome.reason) == ("refused", "gpu-busy")
    assert [p.pid for p in outcome.processes] == [4242]
    assert src.gpu_state(gpu).dbe == 1  # type: ignore[union-attr]


async def test_an_unknown_gpu_is_not_found() -> None:
    with pytest.raises(UnknownGpu):
        await NvmlProbe(SimNvml(sim()), 1.0).check("GPU-nope")
