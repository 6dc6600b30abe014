"""Builds the configured sources; each import is lazy so a simulator agent never loads pynvml."""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.agent.config import AgentConfig
from gpuhealth.agent.model import Source
from gpuhealth.agent.state import EngineView
from gpuhealth.common.clock import Clock


def normalize_pci(address: str) -> str | None:
    """``0000:1b:00``, ``00000000:1B:00.0`` -> ``0000:1b:00.0``; None when it is no address."""
    parts = address.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    domain, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"
    except ValueError:
        return None


def pci_lookup(engine: EngineView) -> Callable[[str], str | None]:
    """PCI address (any common spelling) -> GPU UUID, from the engine's current inventory."""
    cache: dict[int, dict[str, str]] = {}

    def lookup(address: str) -> str | None:
        inv = engine.inventory()
        if inv is None:
            return None
        table = cache.get(id(inv))
        if table is None:
            cache.clear()
            table = cache[id(inv)] = {
                key: g.uuid for g in inv.gpus if (key := normalize_pci(g.pci_bus_id)) is not None
            }
        key = normalize_pci(address)
        return table.get(key) if key is not None else None

    return lookup


def build_sources(
    config: AgentConfig, clock: Clock, pci_to_uuid: Callable[[str], str | None]
) -> list[Source]:
    sources: list[Source] = []
    if config.source == "nvml":
        from gpuhealth.agent.sources.nvml import NvmlSource

        sources.append(NvmlSource(config.nvml, clock))
    elif config.source == "dcgm-exporter":
        from gpuhealth.agent.sources.dcgm import DcgmExporterSource

        sources.append(DcgmExporterSource(config.dcgm_exporter_url, config.dcgm, clock))
    else:
        from gpuhealth.agent.sources.scenario import Scenario, load_scenario
        from gpuhealth.agent.sources.sim import SimSource

        scenario = load_scenario(config.sim_scenario) if config.sim_scenario else Scenario()
        sources.append(SimSource(scenario, clock, config.sim_seed))
    if config.kmsg_enabled:
        from gpuhealth.agent.sources.kmsg import KmsgSource

        sources.append(KmsgSource(config.kmsg_path, config.kmsg, clock, pci_to_uuid))
    return sources
