"""A sysfs tree with GPUs and InfiniBand/RoCE NICs in it, for the RDMA source's tests.

Shaped like the kernel's: every PCI function a directory under ``devices/`` below its host
bridge and bridges; ``bus/pci/devices/<address>`` and ``class/infiniband/<dev>`` relative links
to them; a NIC's ``device`` link, its ``ports/<n>/`` files (``state`` ``4: ACTIVE``,
``phys_state`` ``5: LinkUp``, ``rate`` ``400 Gb/sec (4X NDR)``, ``link_layer``), its
``counters/`` (the InfiniBand PortCounters, and the data counters nobody judges) and
``hw_counters/`` (mlx5's); its netdevs under the function's ``net/``; a RoCE bond as
``devices/virtual/net/<bond>`` with ``lower_<slave>`` links and each slave's ``master``. The
models are ConnectX-6 (``MT4123``) and ConnectX-7 (``MT4129``) as ``hca_type`` names them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CX6 = "MT4123"
CX7 = "MT4129"
IB_COUNTERS = {
    "symbol_error": 0,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 0,
    "port_xmit_discards": 0,
    "port_xmit_constraint_errors": 0,
    "port_rcv_constraint_errors": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "VL15_dropped": 0,
    "port_xmit_data": 81_234_567_890,
    "port_rcv_data": 79_876_543_210,
    "port_xmit_packets": 123_456_789,
    "port_rcv_packets": 120_987_654,
    "port_xmit_wait": 4_321,
    "unicast_xmit_packets": 123_456_000,
    "unicast_rcv_packets": 120_987_000,
    "multicast_xmit_packets": 789,
    "multicast_rcv_packets": 654,
}
"""A ConnectX port's ``counters/`` on a quiet, healthy link (the files a 6.x kernel serves)."""
HW_COUNTERS = {
    "duplicate_request": 0,
    "implied_nak_seq_err": 0,
    "lifespan": 10,
    "local_ack_timeout_err": 0,
    "np_cnp_sent": 0,
    "np_ecn_marked_roce_packets": 0,
    "out_of_buffer": 0,
    "out_of_sequence": 0,
    "packet_seq_err": 0,
    "req_cqe_error": 0,
    "req_cqe_flush_error": 0,
    "req_remote_access_errors": 0,
    "req_remote_invalid_request": 0,
    "resp_cqe_error": 0,
    "resp_cqe_flush_error": 0,
    "resp_local_length_error": 0,
    "resp_remote_access_errors": 0,
    "rnr_nak_retry_err": 0,
    "rp_cnp_handled": 0,
    "rp_cnp_ignored": 0,
    "rx_atomic_requests": 0,
    "rx_icrc_encapsulated": 0,
    "rx_read_requests": 0,
    "rx_write_requests": 0,
    "roce_adp_retrans": 0,
    "roce_slow_restart": 0,
}
"""mlx5's ``hw_counters/``."""
NO_PMA = "N/A (no PMA)"
"""What an older kernel wrote in a counter file of a port without a performance agent."""
STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}
RATES = {
    "InfiniBand": {400: "400 Gb/sec (4X NDR)", 200: "200 Gb/sec (4X HDR)"},
    "Ethernet": {400: "400 Gb/sec (4X NDR)", 200: "200 Gb/sec (4X HDR)", 25: "25 Gb/sec (1X EDR)"},
}
"""How the kernel writes a rate (a RoCE port's too: mlx5 maps its Ethernet speed to IB's
width and speed names)."""


@dataclass
class PortSpec:
    """One port's files as a test wants them."""

    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    rate_gbps: int = 400
    link_layer: str = "InfiniBand"
    counters: dict[str, int | str] = field(default_factory=lambda: dict(IB_COUNTERS))
    hw_counters: dict[str, int | str] = field(default_factory=lambda: dict(HW_COUNTERS))


def _link(link: Path, target: Path) -> None:
    """A relative symlink at ``link`` to ``target``, as sysfs makes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


class SysfsTree:
    """A sysfs root under ``root`` that tests add functions, GPUs and NICs to."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "devices").mkdir(parents=True, exist_ok=True)
        (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)

    def function(self, path: Sequence[str], *, numa_node: int = 0) -> Path:
        """The PCI function at ``path`` (host bridge first, then every bridge down to it),
        with ``bus/pci/devices/<address>`` for each function on the way."""
        d = self.root / "devices" / path[0]
        d.mkdir(exist_ok=True)
        for part in path[1:]:
            d = d / part
            if not d.exists():
                d.mkdir()
                (d / "numa_node").write_text(f"{numa_node}\n")
                _link(self.root / "bus" / "pci" / "devices" / part, d)
        return d

    def gpu(self, path: Sequence[str], *, numa_node: int = 0) -> str:
        """An NVIDIA GPU function; its address."""
        d = self.function(path, numa_node=numa_node)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        return path[-1]

    def nic(
        self,
        name: str,
        path: Sequence[str],
        ports: Mapping[int, PortSpec] | None = None,
        *,
        model: str = CX7,
        netdev: str | None = None,
        numa_node: int = 0,
    ) -> Path:
        """An RDMA device ``name`` on the function at ``path`` (created if needed), with its
        ports (default: port 1, an ACTIVE 400 Gb/s InfiniBand link) and its netdev."""
        fn = self.function(path, numa_node=numa_node)
        (fn / "vendor").write_text("0x15b3\n")
        dev = fn / "infiniband" / name
        dev.mkdir(parents=True)
        _link(self.root / "class" / "infiniband" / name, dev)
        _link(dev / "device", fn)
        (dev / "hca_type").write_text(f"{model}\n")
        (dev / "fw_ver").write_text("28.39.1002\n")
        (dev / "board_id").write_text("MT_0000000838\n")
        (dev / "node_type").write_text("1: CA\n")
        for number, spec in (ports or {1: PortSpec()}).items():
            self.set_port(name, number, spec)
        if netdev is not None:
            (fn / "net" / netdev).mkdir(parents=True)
            (fn / "net" / netdev / "operstate").write_text("up\n")
        return dev

    def port_dir(self, name: str, port: int) -> Path:
        return self.root / "class" / "infiniband" / name / "ports" / str(port)

    def set_port(self, name: str, port: int, spec: PortSpec) -> None:
        d = self.port_dir(name, port)
        (d / "counters").mkdir(parents=True, exist_ok=True)
        (d / "hw_counters").mkdir(exist_ok=True)
        self.write(name, port, "state", f"{STATES.get(spec.state, 0)}: {spec.state}")
        self.write(
            name, port, "phys_state", f"{PHYS_STATES.get(spec.phys_state, 0)}: {spec.phys_state}"
        )
        self.write(
            name,
            port,
            "rate",
            RATES[spec.link_layer].get(spec.rate_gbps, f"{spec.rate_gbps} Gb/sec"),
        )
        self.write(name, port, "link_layer", spec.link_layer)
        (d / "lid").write_text("0x2a\n")
        for counter, value in spec.counters.items():
            self.write(name, port, f"counters/{counter}", str(value))
        for counter, value in spec.hw_counters.items():
            self.write(name, port, f"hw_counters/{counter}", str(value))

    def write(self, name: str, port: int, rel: str, value: str) -> None:
        """One port file (``state``, ``counters/symbol_error`` ...), written the way the kernel
        shows it (one line)."""
        path = self.port_dir(name, port) / rel
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(value + "\n")
        tmp.replace(path)

    def counter(self, name: str, port: int, counter: str) -> int:
        return int((self.port_dir(name, port) / "counters" / counter).read_text())

    def bond(self, bond: str, slaves: Mapping[str, Path]) -> None:
        """A bonding master ``bond`` (``devices/virtual/net``) over the netdevs ``slaves``
        (name -> the function they belong to)."""
        master = self.root / "devices" / "virtual" / "net" / bond
        (master / "bonding").mkdir(parents=True)
        (master / "bonding" / "slaves").write_text(" ".join(slaves) + "\n")
        _link(self.root / "class" / "net" / bond, master)
        for slave, fn in slaves.items():
            nd = fn / "net" / slave
            nd.mkdir(parents=True, exist_ok=True)
            _link(nd / "master", master)
            _link(master / f"lower_{slave}", nd)

    def virtual_function(self, vf: Sequence[str], pf: Sequence[str]) -> Path:
        """An SR-IOV virtual function at ``vf`` of the physical function at ``pf``."""
        fn = self.function(vf)
        _link(fn / "physfn", self.function(pf))
        return fn

    def remove_device(self, name: str) -> None:
        """The NIC's RDMA device goes (hot-removed, its driver unloaded)."""
        link = self.root / "class" / "infiniband" / name
        target = link.resolve()
        link.unlink()
        _rmtree(target)


def _rmtree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            _rmtree(child)
        else:
            child.unlink()
    path.rmdir()


HOST_A = ("pci0000:15", "0000:15:01.0", "0000:16:00.0")
"""A root port and a PCIe switch's upstream port below host bridge 15."""
HOST_B = ("pci0000:97", "0000:97:01.0", "0000:98:00.0")
"""The same on another root complex (the other socket)."""


def below(switch: Sequence[str], port: str, function: str) -> tuple[str, ...]:
    """A function behind downstream port ``port`` of ``switch``."""
    return (*switch, port, function)


def hgx_pair(tree: SysfsTree) -> dict[str, str]:
    """Two GPUs and a ConnectX-7 InfiniBand NIC behind one PCIe switch, and a GPU and a
    ConnectX-7 behind another switch on the other root complex (as on an HGX H100 board): name
    -> address. Returns ``{"gpu0", "gpu1", "gpu2", "mlx5_0", "mlx5_1"}``."""
    out = {
        "gpu0": tree.gpu(below(HOST_A, "0000:17:00.0", "0000:18:00.0")),
        "gpu1": tree.gpu(below(HOST_A, "0000:17:02.0", "0000:1a:00.0")),
        "gpu2": tree.gpu(below(HOST_B, "0000:99:00.0", "0000:9a:00.0"), numa_node=1),
    }
    tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"), netdev="ib0")
    tree.nic("mlx5_1", below(HOST_B, "0000:99:01.0", "0000:9b:00.0"), netdev="ib1", numa_node=1)
    out["mlx5_0"] = "0000:19:00.0"
    out["mlx5_1"] = "0000:9b:00.0"
    return out
