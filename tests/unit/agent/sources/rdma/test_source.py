"""The RDMA source over sysfs trees: each poll one observation; a NIC hot-removed, a read that
hangs, garbage and unreadable files, counters not served or stopped: a log line and a count,
never a crash and never a value made up."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpuhealth.agent.observations import NicObservation, Observation, PciAddress
from gpuhealth.agent.sources.rdma.settings import RdmaSettings
from gpuhealth.agent.sources.rdma.source import (
    RDMA_COUNTERS_SATURATED,
    RDMA_COUNTERS_UNAVAILABLE,
    RDMA_DEVICES_REMOVED,
    RDMA_READ_ERRORS,
    RDMA_READ_TIMEOUTS,
    RdmaSource,
)
from tests.support.clock import FakeClock
from tests.support.rdma_sysfs import HOST_A, NO_PMA, PortSpec, SysfsTree, below, hgx_pair


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return SysfsTree(tmp_path / "sys")


def _source(tree: SysfsTree, *gpus: str, **settings: object) -> RdmaSource:
    addresses = [a for g in gpus if (a := PciAddress.parse(g)) is not None]
    cfg = RdmaSettings(sysfs_root=str(tree.root), **settings)  # type: ignore[arg-type]
    return RdmaSource(cfg, FakeClock(), lambda: addresses)


async def _poll(src: RdmaSource) -> NicObservation:
    obs = await src.poll()
    assert obs is not None
    return obs


async def test_one_poll_reads_every_port_with_its_gpus(tree: SysfsTree) -> None:
    names = hgx_pair(tree)
    src = _source(tree, names["gpu0"], names["gpu1"], names["gpu2"])
    obs = await _poll(src)
    assert obs.source == "rdma" and obs.unread == frozenset()
    assert [(p.device, [str(g) for g in p.gpus], p.affinity) for p in obs.ports] == [
        ("mlx5_0", [names["gpu0"], names["gpu1"]], "PIX"),
        ("mlx5_1", [names["gpu2"]], "PIX"),
    ]
    assert src.up and src.ready and src.errors == 0


async def test_a_node_without_rdma_devices_costs_nothing_and_raises_nothing(
    tmp_path: Path,
) -> None:
    src = RdmaSource(RdmaSettings(sysfs_root=str(tmp_path / "empty")), FakeClock())
    obs = await _poll(src)
    assert obs.ports == () and src.up and src.ready
    assert all(v == {"": 0} or v == {} for _, v in src.counters)


async def test_a_hot_removed_nic_is_logged_counted_and_gone(tree: SysfsTree) -> None:
    hgx_pair(tree)
    src = _source(tree)
    await _poll(src)
    tree.remove_device("mlx5_1")
    with capture_logs() as logs:
        obs = await _poll(src)
    assert [p.device for p in obs.ports] == ["mlx5_0"] and obs.unread == frozenset()
    assert src.counters.value(RDMA_DEVICES_REMOVED) == 1
    assert [e["device"] for e in logs if e["event"] == "rdma_device_removed"] == ["mlx5_1"]
    await _poll(src)
    assert src.counters.value(RDMA_DEVICES_REMOVED) == 1  # counted once


@contextlib.contextmanager
def _hung(tree: SysfsTree, name: str) -> Iterator[None]:
    """The NIC's read blocks (its ``hca_type`` is a FIFO nobody writes: a firmware command that
    never answers) until the block is left."""
    path = tree.root / "class" / "infiniband" / name / "hca_type"
    path.unlink()
    os.mkfifo(path)
    try:
        yield
    finally:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # the blocked reader wakes up
        path.unlink()
        path.write_text("MT4129\n")  # the firmware answers again
        os.write(fd, b"MT4129\n")
        os.close(fd)


async def test_a_hung_nic_is_unread_and_not_asked_again_the_others_are_read(
    tree: SysfsTree,
) -> None:
    hgx_pair(tree)
    src = _source(tree, read_deadline_s=0.2)
    with _hung(tree, "mlx5_1"):
        with capture_logs() as logs:
            obs = await _poll(src)
        assert [p.device for p in obs.ports] == ["mlx5_0"]
        assert obs.unread == {"mlx5_1"} and not src.up and src.errors == 1
        assert src.counters.by_label(RDMA_READ_TIMEOUTS) == {"mlx5_1": 1}
        assert any(e["event"] == "rdma_read_timeout" for e in logs)
        obs = await _poll(src)  # still hung: not asked again, so no second timeout
        assert obs.unread == {"mlx5_1"}
        assert src.counters.by_label(RDMA_READ_TIMEOUTS) == {"mlx5_1": 1}
    for _ in range(50):  # the late read returns; the next poll asks again
        obs = await _poll(src)
        if not obs.unread:
            break
        await asyncio.sleep(0.02)
    assert [p.device for p in obs.ports] == ["mlx5_0", "mlx5_1"] and src.up


async def test_garbage_and_unreadable_files_are_counted_each_poll_and_logged_twice(
    tree: SysfsTree,
) -> None:
    hgx_pair(tree)
    src = _source(tree)
    tree.write("mlx5_0", 1, "counters/symbol_error", "0x2a?")
    state = tree.port_dir("mlx5_0", 1) / "state"
    state.unlink()
    state.mkdir()
    with capture_logs() as logs:
        await _poll(src)
        obs = await _poll(src)
    assert obs.ports[0].port_state is None and "symbol_error" not in obs.ports[0].counters
    assert src.counters.by_label(RDMA_READ_ERRORS) == {"garbage": 2, "unreadable": 2}
    unusable = [(e["file"], e["problem"]) for e in logs if e["event"] == "rdma_file_unusable"]
    assert sorted(unusable) == [
        ("ports/1/counters/symbol_error", "garbage"),
        ("ports/1/state", "unreadable"),
    ]
    state.rmdir()
    tree.write("mlx5_0", 1, "state", "4: ACTIVE")
    tree.write("mlx5_0", 1, "counters/symbol_error", "0")
    with capture_logs() as logs:
        obs = await _poll(src)
    assert obs.ports[0].port_state == "ACTIVE"
    again = sorted(e["file"] for e in logs if e["event"] == "rdma_file_readable_again")
    assert again == ["ports/1/counters/symbol_error", "ports/1/state"]


async def test_counters_not_served_or_stopped_are_counted_once(tree: SysfsTree) -> None:
    roce = PortSpec(link_layer="Ethernet", rate_gbps=200)
    roce.counters = {**roce.counters, "symbol_error": NO_PMA, "link_downed": "255"}
    tree.nic("mlx5_2", below(HOST_A, "0000:17:01.0", "0000:19:00.0"), {1: roce})
    src = _source(tree)
    for _ in range(3):
        obs = await _poll(src)
    assert obs.ports[0].saturated == {"link_downed"}
    assert src.counters.value(RDMA_COUNTERS_UNAVAILABLE) == 1
    assert src.counters.value(RDMA_COUNTERS_SATURATED) == 1


async def test_virtual_functions_and_unlisted_devices_are_left_out(tree: SysfsTree) -> None:
    names = hgx_pair(tree)
    pf = below(HOST_A, "0000:17:01.0", "0000:19:00.0")
    vf = below(HOST_A, "0000:17:01.0", "0000:19:00.2")
    tree.virtual_function(vf, pf)
    tree.nic("mlx5_4", vf)
    assert [p.device for p in (await _poll(_source(tree))).ports] == ["mlx5_0", "mlx5_1"]
    with_vfs = _source(tree, include_virtual_functions=True)
    assert [p.device for p in (await _poll(with_vfs)).ports] == ["mlx5_0", "mlx5_1", "mlx5_4"]
    only = _source(tree, names["gpu2"], devices=frozenset({"mlx5_1"}))
    assert [p.device for p in (await _poll(only)).ports] == ["mlx5_1"]


async def test_run_polls_on_the_clock_and_stops_its_threads(tree: SysfsTree) -> None:
    hgx_pair(tree)
    clock = FakeClock()
    src = RdmaSource(RdmaSettings(sysfs_root=str(tree.root), poll_interval_s=5.0), clock)
    seen: list[Observation] = []
    task = asyncio.create_task(src.run(seen.append))
    for _ in range(200):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert len(seen) == 1
    await clock.advance_and_settle(5.0)
    for _ in range(200):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(seen) == 2 and src.polls.count == 2
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert src._nics == {} and src._listing is None
