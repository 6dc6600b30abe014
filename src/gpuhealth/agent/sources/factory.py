"""Builds the configured sources; each import is lazy so a simulator agent never loads pynvml."""

from __future__ import annotations

from gpuhealth.agent.settings import AgentSettings
from gpuhealth.agent.sources.base import Source
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.clock import Clock


def build_sources(
    config: AgentSettings,
    clock: Clock,
    store: StateStore | None = None,
    *,
    boot_id: str | None = None,
) -> list[Source]:
    """``store``: where a source keeps what it needs across a restart (None: the state dir's
    own); ``boot_id``: the kernel's (None: read it), for what a source keeps per boot."""
    state = store if store is not None else config.state_dir
    sources: list[Source] = []
    if config.source == "nvml":
        from gpuhealth.agent.boot import read_boot_id
        from gpuhealth.agent.sources.nvml import NvmlSource

        sources.append(
            NvmlSource(config.nvml, clock, state=state, boot_id=boot_id or read_boot_id())
        )
    elif config.source == "dcgm-exporter":
        from gpuhealth.agent.sources.dcgm import DcgmExporterSource

        sources.append(
            DcgmExporterSource(
                config.dcgm_exporter_url,
                config.dcgm,
                clock,
                state=state,
                boot_id=boot_id,
            )
        )
    else:
        from gpuhealth.agent.sources.scenario import Scenario, load_scenario
        from gpuhealth.agent.sources.sim import SimSource
        from gpuhealth.agent.sources.sim_boot import resume_at

        scenario = load_scenario(config.sim_scenario) if config.sim_scenario else Scenario()
        resume = resume_at(config.state_dir)  # after a simulated reboot
        sources.append(SimSource(scenario, clock, config.sim_seed, resume_at_s=resume))
    if config.kmsg_enabled:
        from gpuhealth.agent.boot import read_boot_id
        from gpuhealth.agent.sources.kmsg import KmsgPosition, KmsgSource

        position = KmsgPosition(state, boot_id or read_boot_id())
        sources.append(KmsgSource(config.kmsg_path, config.kmsg, clock, position=position))
    return sources
