"""Which devices the test device plugin advertises: the simulator's GPUs."""

from __future__ import annotations

from pathlib import Path

from gpuhealth.agent.sources.sim.scenario import Scenario, load_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.clock import SystemClock


def sim_gpu_uuids(scenario: Path | None = None, seed: int = 0) -> list[str]:
    """The UUIDs of the GPUs ``gpuhealth-agent --source sim`` reports with the same
    ``--sim-scenario`` and ``--sim-seed`` (index order)."""
    loaded = load_scenario(scenario) if scenario is not None else Scenario()
    inventory = SimSource(loaded, SystemClock(), seed).inventory()
    return [gpu.uuid for gpu in inventory.gpus]
