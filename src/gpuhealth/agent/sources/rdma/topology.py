"""Which GPUs sit behind a NIC, by PCIe topology from sysfs.

Every PCI function is a directory under ``/sys/devices``, below its host bridge and every
bridge on the way: ``pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:01.0/0000:1a:00.0`` is a NIC
behind root port ``17:00.0`` and a PCIe switch (upstream port ``18:00.0``, downstream port
``19:01.0``). ``/sys/class/infiniband/<dev>/device`` and ``/sys/bus/pci/devices/<address>``
are links to such directories. Two functions' paths share a prefix as long as they share the
way up: :func:`affinity` reads it as ``nvidia-smi topo -m`` does (PIX: one switch, PXB: several
switches, PHB: only the host bridge), and :func:`pair` gives a NIC the GPUs that share the
most of it (the closest switch, else the root complex, else, where allowed, the NUMA node).

A RoCE bond (``mlx5_bond_0``: two physical functions behind one netdev) is every function of
the bond: the device's own, and those of the netdevs enslaved to its netdev's master
(:func:`nic_functions`). Pure functions over paths, and the few link reads that find them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuhealth.agent.observations import PciAddress
from gpuhealth.agent.sources.rdma.settings import Pairing

PciPath = tuple[str, ...]
"""A PCI function's directories under ``/sys/devices``, from its host bridge
(``pci0000:17``) down to itself."""
Affinity = Literal["PIX", "PXB", "PHB", "NODE"]

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_FUNCTION = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_REACH: dict[Pairing, int] = {"switch": 2, "root-complex": 1, "numa-node": 1}
"""The shared prefix a pairing needs (2: a bridge below the host bridge; 1: the host bridge)."""


def pci_path(root: Path, link: Path) -> PciPath | None:
    """The PCI function ``link`` leads to (a ``device`` link, ``bus/pci/devices/<address>``,
    or a directory below a function, such as its ``net/<netdev>``); None when it leads to no
    PCI function (a software RDMA device, a virtual netdev) or does not exist."""
    try:
        real = Path(os.path.realpath(link, strict=True))
        rel = real.relative_to(os.path.realpath(root / "devices"))
    except (OSError, ValueError):
        return None
    parts = rel.parts
    if not parts or not _HOST_BRIDGE.match(parts[0]):
        return None
    path = [parts[0]]
    for part in parts[1:]:
        if not _FUNCTION.match(part):
            break
        path.append(part)
    return tuple(path) if len(path) > 1 else None


def shared(a: PciPath, b: PciPath) -> int:
    """How many directories two paths share from the host bridge down."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def affinity(nic: PciPath, gpu: PciPath) -> Affinity | None:
    """How far apart two functions are (``nvidia-smi topo -m``): ``PIX`` (below one PCIe
    switch: each at most a downstream port away from the bridge they share), ``PXB`` (a
    bridge below the host bridge, through more switches), ``PHB`` (only the host bridge),
    None (different root complexes)."""
    n = shared(nic, gpu)
    if n == 0:
        return None
    if n == 1:
        return "PHB"
    return "PIX" if max(len(nic), len(gpu)) - n <= 2 else "PXB"


_RANK: dict[str, int] = {"PIX": 3, "PXB": 2, "PHB": 1, "NODE": 0}


@dataclass(frozen=True, slots=True)
class GpuPlace:
    """Where a GPU is: its function's path and NUMA node (-1: not known)."""

    path: PciPath
    numa_node: int = -1


def pair(
    functions: Sequence[PciPath],
    gpus: Mapping[PciAddress, GpuPlace],
    *,
    numa_node: int = -1,
    reach: Pairing = "root-complex",
) -> tuple[tuple[PciAddress, ...], Affinity | None]:
    """The GPUs behind a NIC whose PCI functions are ``functions`` (one, or a bond's), and how
    close they are: those sharing the most of the way up with any of them, if that reaches
    ``reach``; with ``numa-node``, else those on the NIC's NUMA node."""
    best = 0
    near: dict[PciAddress, int] = {}
    for address, place in gpus.items():
        depth = max((shared(f, place.path) for f in functions), default=0)
        if depth:
            near[address] = depth
            best = max(best, depth)
    if best >= _REACH[reach]:
        chosen = sorted(a for a, d in near.items() if d == best)
        closest: Affinity | None = None
        for f in functions:
            for a in chosen:
                level = affinity(f, gpus[a].path)
                if level is not None and (closest is None or _RANK[level] > _RANK[closest]):
                    closest = level
        return tuple(chosen), closest
    if reach == "numa-node" and numa_node >= 0:
        same = tuple(sorted(a for a, p in gpus.items() if p.numa_node == numa_node))
        if same:
            return same, "NODE"
    return (), None


def read_numa_node(root: Path, path: PciPath) -> int:
    """A function's NUMA node (``numa_node``; -1 when not known)."""
    try:
        text = (root / "devices" / Path(*path) / "numa_node").read_text()
        return int(text.strip())
    except (OSError, ValueError):
        return -1


def gpu_places(root: Path, addresses: Sequence[PciAddress]) -> dict[PciAddress, GpuPlace]:
    """Where each GPU is (``bus/pci/devices/<address>``); a GPU sysfs does not show (gone
    from the bus, another root) is left out."""
    out: dict[PciAddress, GpuPlace] = {}
    for address in addresses:
        path = pci_path(root, root / "bus" / "pci" / "devices" / str(address))
        if path is not None:
            out[address] = GpuPlace(path, read_numa_node(root, path))
    return out


@dataclass(frozen=True, slots=True)
class NicFunctions:
    """An RDMA device's PCI functions and network device."""

    functions: tuple[PciPath, ...]
    """Its own function first, then the other functions of its bond."""
    netdev: str = ""
    """The bond's netdev (``bond0``) when its function's netdev is enslaved, else that netdev
    (``ib0``, ``ens1f0np0``); empty without one."""
    virtual_function: bool = False
    """An SR-IOV virtual function (its ``device`` has a ``physfn`` link)."""


def nic_functions(root: Path, device_dir: Path) -> NicFunctions:
    """The PCI functions of the RDMA device at ``device_dir`` (``class/infiniband/<dev>``):
    its ``device``, and for a bond the functions of every netdev enslaved to the master of
    its function's netdev (``<master>/lower_*``)."""
    device = device_dir / "device"
    own = pci_path(root, device)
    if own is None:
        return NicFunctions(())
    functions = [own]
    netdevs = _listdir(device / "net")
    netdev = netdevs[0] if netdevs else ""
    for name in netdevs:
        master = device / "net" / name / "master"
        if not master.is_symlink():
            continue
        netdev = Path(os.path.realpath(master)).name
        for lower in _listdir(master):
            if lower.startswith("lower_"):
                path = pci_path(root, master / lower)
                if path is not None and path not in functions:
                    functions.append(path)
        break
    return NicFunctions(tuple(functions), netdev, (device / "physfn").is_symlink())


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
