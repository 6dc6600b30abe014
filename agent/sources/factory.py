"""Builds the configured sources; each import is lazy so a simulator agent never loads pynvml."""

from __future__ import annotations

from gpuhealth.agent.config import AgentConfig
from gpuhealth.agent.sources.base import Source
from gpuhealth.common.clock import Clock


def build_sources(
    config: AgentConfig,
    clock: Clock,
    *,
    boot_id: str | None = None,
) -> list[Source]:
    """``boot_id``: the kernel's (None: read it), for what a source keeps per boot."""
    sources: list[Source] = []
    if config.source == "nvml":
        from gpuhealth.agent.sources.nvml import NvmlSource

        sources.append(NvmlSource(config.nvml, clock))
    elif config.source == "dcgm-exporter":
        from gpuhealth.agent.sources.dcgm import DcgmExporterSource

        sources.append(
            DcgmExporterSource(
                config.dcgm_exporter_url,
                config.dcgm,
                clock,
                state_dir=config.state_dir,
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
        from gpuhealth.agent.sources.kmsg import KmsgSource
        from gpuhealth.agent.sources.kmsg_position import KmsgPosition

        position = KmsgPosition(config.state_dir, boot_id or read_boot_id())
        sources.append(KmsgSource(config.kmsg_path, config.kmsg, clock, position=position))
    return sources
