"""Which GPUs sit behind a NIC: the PCIe paths from sysfs, read like ``nvidia-smi topo -m``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.observations import PciAddress
from gpuhealth.agent.sources.rdma.topology import (
    GpuPlace,
    PciPath,
    affinity,
    gpu_places,
    nic_functions,
    pair,
    pci_path,
)
from tests.support.rdma_sysfs import HOST_A, HOST_B, PortSpec, SysfsTree, below, hgx_pair

ROOT_PORT = ("pci0000:15", "0000:15:01.0")
SWITCH = (*ROOT_PORT, "0000:16:00.0")
NIC: PciPath = (*SWITCH, "0000:17:01.0", "0000:19:00.0")


@pytest.mark.parametrize(
    ("gpu", "want"),
    [
        ((*SWITCH, "0000:17:00.0", "0000:18:00.0"), "PIX"),  # the NIC's own switch
        # behind a second switch below the first: more than one switch on the way
        ((*SWITCH, "0000:17:03.0", "0000:1c:00.0", "0000:1d:00.0", "0000:1e:00.0"), "PXB"),
        (("pci0000:15", "0000:15:03.0", "0000:40:00.0"), "PHB"),  # only the host bridge
        (("pci0000:97", "0000:97:01.0", "0000:98:00.0"), None),  # another root complex
    ],
)
def test_affinity_reads_the_shared_way_up(gpu: PciPath, want: str | None) -> None:
    assert affinity(NIC, gpu) == want
    assert affinity(gpu, NIC) == want


def _gpus(*paths: PciPath, numa: tuple[int, ...] = ()) -> dict[PciAddress, GpuPlace]:
    out = {}
    for i, path in enumerate(paths):
        address = PciAddress.parse(path[-1])
        assert address is not None
        out[address] = GpuPlace(path, numa[i] if numa else 0)
    return out


SAME_SWITCH = (*SWITCH, "0000:17:00.0", "0000:18:00.0")
SAME_SWITCH_2 = (*SWITCH, "0000:17:02.0", "0000:1a:00.0")
SAME_ROOT = ("pci0000:15", "0000:15:03.0", "0000:40:00.0")
OTHER_ROOT = ("pci0000:97", "0000:97:01.0", "0000:98:00.0")


@pytest.mark.parametrize(
    ("gpus", "reach", "want", "level"),
    [
        # the closest switch wins; a GPU only sharing the root complex is another NIC's
        ((SAME_SWITCH, SAME_SWITCH_2, SAME_ROOT, OTHER_ROOT), "root-complex",
         ("0000:18:00.0", "0000:1a:00.0"), "PIX"),
        # no GPU on the NIC's switch: the ones on its root complex
        ((SAME_ROOT, OTHER_ROOT), "root-complex", ("0000:40:00.0",), "PHB"),
        ((SAME_ROOT, OTHER_ROOT), "switch", (), None),  # not close enough
        ((OTHER_ROOT,), "root-complex", (), None),  # separate root complexes: none
        ((OTHER_ROOT,), "numa-node", ("0000:98:00.0",), "NODE"),  # same NUMA node
        ((), "root-complex", (), None),
    ],
)  # fmt: skip
def test_pair_takes_the_closest_gpus_within_reach(
    gpus: tuple[PciPath, ...], reach: str, want: tuple[str, ...], level: str | None
) -> None:
    behind, near = pair([NIC], _gpus(*gpus), numa_node=0, reach=reach)  # type: ignore[arg-type]
    assert [str(a) for a in behind] == list(want)
    assert near == level


def test_numa_fallback_needs_a_known_and_equal_node() -> None:
    gpus = _gpus(OTHER_ROOT, numa=(1,))
    assert pair([NIC], gpus, numa_node=0, reach="numa-node") == ((), None)
    assert pair([NIC], gpus, numa_node=-1, reach="numa-node") == ((), None)


def test_a_bond_pairs_with_the_gpus_of_every_function() -> None:
    """A bond's second function on another switch brings that switch's GPU too."""
    second = ("pci0000:97", "0000:97:01.0", "0000:98:00.0", "0000:99:01.0", "0000:9b:00.1")
    gpu_b = ("pci0000:97", "0000:97:01.0", "0000:98:00.0", "0000:99:00.0", "0000:9a:00.0")
    behind, near = pair([NIC, second], _gpus(SAME_SWITCH, gpu_b, SAME_ROOT))
    assert [str(a) for a in behind] == ["0000:18:00.0", "0000:9a:00.0"]
    assert near == "PIX"


def test_paths_are_read_from_the_links(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    names = hgx_pair(tree)
    gpu0 = PciAddress.parse(names["gpu0"])
    assert gpu0 is not None
    assert pci_path(tmp_path, tmp_path / "bus/pci/devices/0000:18:00.0") == below(
        HOST_A, "0000:17:00.0", "0000:18:00.0"
    )
    dev = tmp_path / "class/infiniband/mlx5_0"
    assert pci_path(tmp_path, dev / "device") == below(HOST_A, "0000:17:01.0", "0000:19:00.0")
    assert pci_path(tmp_path, dev / "device" / "net" / "ib0") == pci_path(tmp_path, dev / "device")
    assert pci_path(tmp_path, tmp_path / "bus/pci/devices/0000:ff:00.0") is None  # no such GPU
    places = gpu_places(tmp_path, [gpu0, PciAddress(0, 0xFF, 0, 0)])
    assert list(places) == [gpu0] and places[gpu0].numa_node == 0
    nic = nic_functions(tmp_path, dev)
    assert nic.functions == (below(HOST_A, "0000:17:01.0", "0000:19:00.0"),)
    assert nic.netdev == "ib0" and not nic.virtual_function


def test_a_software_rdma_device_has_no_pci_function(tmp_path: Path) -> None:
    """Soft-RoCE (``rxe0``) lives under ``devices/virtual``: no function, no GPU."""
    tree = SysfsTree(tmp_path)
    dev = tmp_path / "devices" / "virtual" / "infiniband" / "rxe0"
    dev.mkdir(parents=True)
    (tmp_path / "class/infiniband/rxe0").symlink_to("../../devices/virtual/infiniband/rxe0")
    assert nic_functions(tmp_path, tmp_path / "class/infiniband/rxe0").functions == ()
    del tree


def test_a_roce_bond_is_both_functions_behind_the_bond_netdev(tmp_path: Path) -> None:
    """``mlx5_bond_0`` sits on the first function; the bond's lower netdevs name both."""
    tree = SysfsTree(tmp_path)
    pf0 = below(HOST_B, "0000:99:01.0", "0000:9b:00.0")
    pf1 = below(HOST_B, "0000:99:01.0", "0000:9b:00.1")
    roce = PortSpec(link_layer="Ethernet", rate_gbps=200)
    dev = tree.nic("mlx5_bond_0", pf0, {1: roce}, model="MT4123")
    tree.bond("bond0", {"ens1f0np0": tree.function(pf0), "ens1f1np1": tree.function(pf1)})
    nic = nic_functions(tmp_path, dev)
    assert nic.functions == (pf0, pf1)
    assert nic.netdev == "bond0"


def test_a_virtual_function_is_known_by_its_physfn(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    pf = below(HOST_A, "0000:17:01.0", "0000:19:00.0")
    vf = below(HOST_A, "0000:17:01.0", "0000:19:00.2")
    tree.virtual_function(vf, pf)
    dev = tree.nic("mlx5_4", vf)
    assert nic_functions(tmp_path, dev).virtual_function
