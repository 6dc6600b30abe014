"""One RDMA device's ports read from a sysfs tree shaped like the kernel's, and what each file
may say (fuzzed: any text is a value or nothing, never an exception)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.health.rail_settings import ERROR_COUNTERS, LINK_DOWNED
from gpuhealth.agent.observations import PciAddress
from gpuhealth.agent.sources.rdma.sysfs import (
    HW_COUNTERS,
    PORT_COUNTER_WIDTHS,
    DeviceGone,
    parse_counter,
    parse_rate,
    parse_state,
    read_device,
)
from gpuhealth.agent.sources.rdma.topology import GpuPlace, gpu_places
from tests.support.rdma_sysfs import (
    CX6,
    HOST_A,
    HOST_B,
    NO_PMA,
    PortSpec,
    SysfsTree,
    below,
    hgx_pair,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("4: ACTIVE\n", "ACTIVE"),
        ("1: DOWN\n", "DOWN"),
        ("5: ACTIVE_DEFER\n", "ACTIVE_DEFER"),
        ("5: LinkUp\n", "LinkUp"),
        ("2: Polling\n", "Polling"),
        ("7: Phy Test\n", "Phy Test"),
        ("ACTIVE\n", None),
        ("4:\n", None),
        ("", None),
        ("\x00\x01", None),
    ],
)
def test_states(text: str, want: str | None) -> None:
    assert parse_state(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("200 Gb/sec (4X HDR)\n", 200.0),
        ("2.5 Gb/sec (1X SDR)\n", 2.5),
        ("53.125 Gb/sec (1X HDR)\n", 53.125),
        ("10 Gb/sec (4X)\n", 10.0),
        ("Invalid argument\n", None),
        ("-5 Gb/sec\n", None),
        ("400 Mb/sec\n", None),
        ("9999999 Gb/sec\n", None),
    ],
)
def test_rates(text: str, want: float | None) -> None:
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("0\n", 0), ("65535\n", 65535), ("18446744073709551615\n", 2**64 - 1),
     ("18446744073709551616\n", None), ("-1\n", None), ("12abc\n", None), (NO_PMA, None),
     ("١٢\n", None), ("\n", None)],
)  # fmt: skip
def test_counters(text: str, want: int | None) -> None:
    assert parse_counter(text) == want


@given(st.text(max_size=80))
def test_any_text_is_a_value_or_nothing(text: str) -> None:
    for parse in (parse_state, parse_rate, parse_counter):
        parse(text)  # never raises
    value = parse_counter(text)
    assert value is None or 0 <= value < 2**64


def test_every_judged_counter_is_read() -> None:
    assert set(PORT_COUNTER_WIDTHS) | set(HW_COUNTERS) == {*ERROR_COUNTERS, LINK_DOWNED}
    assert PORT_COUNTER_WIDTHS[LINK_DOWNED] == 8  # it stops at 255


def _places(root: Path, *addresses: str) -> dict[PciAddress, GpuPlace]:
    parsed = [a for x in addresses if (a := PciAddress.parse(x)) is not None]
    return gpu_places(root, parsed)


def test_a_connectx7_infiniband_port(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    names = hgx_pair(tree)
    read = read_device(
        tmp_path, "mlx5_0", _places(tmp_path, names["gpu0"], names["gpu1"], names["gpu2"])
    )  # type: ignore[arg-type]
    (p,) = read.ports
    assert (p.device, p.port, p.link_layer) == ("mlx5_0", 1, "InfiniBand")
    assert (p.port_state, p.phys_state, p.rate_gbps, p.up) == ("ACTIVE", "LinkUp", 400.0, True)
    assert p.model == "MT4129" and p.netdev == "ib0"
    assert [str(a) for a in p.gpus] == [names["gpu0"], names["gpu1"]] and p.affinity == "PIX"
    assert p.counters["symbol_error"] == 0 and p.counters[LINK_DOWNED] == 0
    assert "out_of_buffer" in p.counters and "port_xmit_data" not in p.counters  # errors only
    assert read.problems == () and read.unavailable == () and p.saturated == frozenset()


def test_a_connectx6_roce_port_without_port_counters(tmp_path: Path) -> None:
    """A RoCE port whose PortCounters have no performance agent: those counters are not
    served (counted once by the source), the rest is read."""
    tree = SysfsTree(tmp_path)
    spec = PortSpec(link_layer="Ethernet", rate_gbps=200)
    spec.counters = {k: NO_PMA for k in spec.counters}
    tree.nic("mlx5_2", below(HOST_B, "0000:99:01.0", "0000:9b:00.0"), {1: spec}, model=CX6,
             netdev="ens1f0np0")  # fmt: skip
    read = read_device(tmp_path, "mlx5_2", {})
    (p,) = read.ports
    assert (p.link_layer, p.rate_gbps, p.model, p.netdev) == ("Ethernet", 200.0, CX6, "ens1f0np0")
    assert set(p.counters) == set(HW_COUNTERS) and p.gpus == () and p.affinity == ""
    assert "ports/1/counters/symbol_error" in read.unavailable and read.problems == ()


def test_a_bonded_pair_reads_one_port_behind_the_bond(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    gpu = tree.gpu(below(HOST_B, "0000:99:00.0", "0000:9a:00.0"))
    pf0 = below(HOST_B, "0000:99:01.0", "0000:9b:00.0")
    pf1 = below(HOST_B, "0000:99:01.0", "0000:9b:00.1")
    tree.nic("mlx5_bond_0", pf0, {1: PortSpec(link_layer="Ethernet", rate_gbps=200)}, model=CX6)
    tree.bond("bond0", {"ens1f0np0": tree.function(pf0), "ens1f1np1": tree.function(pf1)})
    (p,) = read_device(tmp_path, "mlx5_bond_0", _places(tmp_path, gpu)).ports
    assert (p.device, p.netdev, [str(a) for a in p.gpus]) == ("mlx5_bond_0", "bond0", [gpu])


def test_garbage_and_unreadable_files_are_problems_not_values(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"))
    tree.write("mlx5_0", 1, "counters/symbol_error", "lots")
    tree.write("mlx5_0", 1, "rate", "fast")
    state = tree.port_dir("mlx5_0", 1) / "phys_state"
    state.unlink()
    state.mkdir()  # reading it fails (EISDIR), as root too
    read = read_device(tmp_path, "mlx5_0", {})
    (p,) = read.ports
    assert p.rate_gbps is None and p.phys_state is None and p.up is None
    assert "symbol_error" not in p.counters and p.port_state == "ACTIVE"
    got = {(x.path, x.kind) for x in read.problems}
    assert got == {
        ("ports/1/counters/symbol_error", "garbage"),
        ("ports/1/rate", "garbage"),
        ("ports/1/phys_state", "unreadable"),
    }


def test_a_counter_at_its_maximum_has_stopped(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"))
    tree.write("mlx5_0", 1, "counters/link_downed", "255")
    tree.write("mlx5_0", 1, "counters/symbol_error", "65534")
    tree.write("mlx5_0", 1, "counters/excessive_buffer_overrun_errors", "15")
    (p,) = read_device(tmp_path, "mlx5_0", {}).ports
    assert p.saturated == {"link_downed", "excessive_buffer_overrun_errors"}


def test_a_device_that_is_gone(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"))
    tree.remove_device("mlx5_0")
    with pytest.raises(DeviceGone):
        read_device(tmp_path, "mlx5_0", {})


def test_a_device_that_disappears_while_it_is_read(tmp_path: Path) -> None:
    """The read blocks on a file (a FIFO stands in for a slow firmware answer); the NIC is
    removed meanwhile: the read ends as DeviceGone, not as a port with missing files."""
    tree = SysfsTree(tmp_path)
    dev = tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"))
    (dev / "hca_type").unlink()
    os.mkfifo(dev / "hca_type")
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(read_device(tmp_path, "mlx5_0", {}))
        except DeviceGone as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    fifo = os.open(dev / "hca_type", os.O_WRONLY)  # the reader is inside the read now
    os.write(fifo, b"MT4129\n")
    tree.remove_device("mlx5_0")
    os.close(fifo)
    reader.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], DeviceGone)


def test_ports_are_read_in_order_and_odd_entries_are_problems(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.nic(
        "mlx4_0",
        below(HOST_A, "0000:17:01.0", "0000:19:00.0"),
        {2: PortSpec(), 1: PortSpec(state="DOWN", phys_state="Polling")},
    )
    (tree.port_dir("mlx4_0", 1).parent / "lost+found").mkdir()
    read = read_device(tmp_path, "mlx4_0", {})
    assert [(p.port, p.up) for p in read.ports] == [(1, False), (2, True)]
    assert [x.path for x in read.problems] == ["ports/lost+found"]
