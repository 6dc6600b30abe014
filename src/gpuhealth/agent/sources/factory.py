"""Builds the configured sources; each import is lazy so a simulator agent never loads pynvml."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpuhealth.agent.observations import PciAddress
from gpuhealth.agent.sources.base import Source
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.sources.rdma.settings import RdmaSettings
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.clock import Clock


class SourceChoice(Protocol):
    """What the factory reads of the agent's settings (``AgentSettings`` is one): the sources
    depend on their own sections, never on the whole configuration."""

    @property
    def source(self) -> str: ...
    @property
    def state_dir(self) -> str: ...
    @property
    def nvml(self) -> NvmlSettings: ...
    @property
    def dcgm(self) -> DcgmSettings: ...
    @property
    def dcgm_exporter_url(self) -> str: ...
    @property
    def sim_scenario(self) -> str | None: ...
    @property
    def sim_seed(self) -> int: ...
    @property
    def kmsg_enabled(self) -> bool: ...
    @property
    def kmsg_path(self) -> str: ...
    @property
    def kmsg(self) -> KmsgSettings: ...
    @property
    def rdma(self) -> RdmaSettings: ...


def build_sources(
    config: SourceChoice,
    clock: Clock,
    store: StateStore | None = None,
    *,
    boot_id: str | None = None,
    gpus: Callable[[], Sequence[PciAddress]] = tuple,
) -> list[Source]:
    """``store``: where a source keeps what it needs across a restart (None: the state dir's
    own); ``boot_id``: the kernel's (None: read it), for what a source keeps per boot;
    ``gpus``: the GPUs' PCI addresses the agent knows now (the RDMA source pairs its NICs with
    them)."""
    state = store if store is not None else config.state_dir
    sources: list[Source] = []
    if config.source == "nvml":
        from gpuhealth.agent.boot import read_boot_id
        from gpuhealth.agent.sources.nvml.source import NvmlSource

        sources.append(
            NvmlSource(config.nvml, clock, state=state, boot_id=boot_id or read_boot_id())
        )
    elif config.source == "dcgm-exporter":
        from gpuhealth.agent.sources.dcgm.source import DcgmExporterSource

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
        from gpuhealth.agent.sources.sim.reboot import resume_at
        from gpuhealth.agent.sources.sim.scenario import Scenario, load_scenario
        from gpuhealth.agent.sources.sim.source import SimSource

        scenario = load_scenario(config.sim_scenario) if config.sim_scenario else Scenario()
        resume = resume_at(config.state_dir)  # after a simulated reboot
        sources.append(SimSource(scenario, clock, config.sim_seed, resume_at_s=resume))
    if config.kmsg_enabled:
        from gpuhealth.agent.boot import read_boot_id
        from gpuhealth.agent.sources.kmsg.source import KmsgPosition, KmsgSource

        position = KmsgPosition(state, boot_id or read_boot_id())
        sources.append(KmsgSource(config.kmsg_path, config.kmsg, clock, position=position))
    root = config.rdma.root_for(config.source)
    if config.rdma.enabled and root is not None:
        from gpuhealth.agent.sources.rdma.source import RdmaSource

        sources.append(RdmaSource(config.rdma, clock, gpus, sysfs_root=root))
    return sources
