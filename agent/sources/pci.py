"""PCI bus addresses: one spelling for comparing them, and the address -> GPU UUID lookup.

NVML writes ``00000000:1B:00.0``, the kernel ``0000:1b:00``, dcgm-exporter either; the kernel-log
follower sees only the address and must find the GPU's UUID from the engine's inventory.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.agent.snapshot import EngineView


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
