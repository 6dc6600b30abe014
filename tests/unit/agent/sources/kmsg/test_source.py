"""The kernel-log follower: counting and mapping lines, on a file, a FIFO and /dev/kmsg
(the parser: test_parser.py)."""

from __future__ import annotations

import asyncio
import os
import select
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.counters import Counters
from gpuhealth.agent.observations import Observation, XidObservation
from gpuhealth.agent.sources.kmsg import readers as inotify
from gpuhealth.agent.sources.kmsg.parser import parse_line
from gpuhealth.agent.sources.kmsg.readers import ReaderContext, _FileWaiter, open_inotify
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import KMSG_LINES, KMSG_MALFORMED, KmsgSource
from gpuhealth.common.config import SettingError
from gpuhealth.common.errors import TransientError
from tests.support.clock import FakeClock
from tests.support.sinks import taking
from tests.support.wait import until

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
PCI = "00000000:1B:00.0"


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace"))
    )
)
def test_fuzz_never_raises(text: str) -> None:
    src = KmsgSource("/nonexistent", KmsgSettings(), FakeClock())
    out: list[Observation] = []
    candidates = (
        text,
        "NVRM: Xid " + text,
        "NVRM: Xid (PCI:0000:1b:00): " + text,
        "NVRM: Xid (PCI:0000:1b:00 GPU-I:" + text,
        "4,1,2,-,caller=T1;NVRM: Xid (PCI:0000:1b:00 GPU-I:01 GPU-CI:02): " + text,
    )
    for candidate in candidates:
        parse_line(candidate)
        src.handle_line(candidate, out.append)
    c = src.counters
    assert c.value(KMSG_LINES) == len(candidates)
    # every Xid line is either reported or counted as malformed: nothing vanishes
    xid_lines = sum("NVRM: Xid" in x for x in candidates)
    assert len(out) + c.value(KMSG_MALFORMED) == xid_lines


def test_handle_line_counts_and_reads_the_address() -> None:
    src = KmsgSource("/x", KmsgSettings(), FakeClock())
    out: list[Observation] = []
    src.handle_line("6,1,1,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=p, gone", out.append)
    src.handle_line("6,2,2,-;NVRM: Xid (PCI:0000:1b:00): what", out.append)
    src.handle_line("6,3,3,-;NVRM: Xid (PCI:0000:99:00): 13, pid=1, x", out.append)
    src.handle_line("6,4,4,-;eth0: link up", out.append)
    c = src.counters
    assert c.value(KMSG_LINES) == 4 and c.value(KMSG_MALFORMED) == 1
    # the source does not map: the engine does (unknown addresses are counted there)
    assert [(o.xid, o.uuid, str(o.pci)) for o in out if isinstance(o, XidObservation)] == [
        (79, None, "0000:1b:00.0"),
        (13, None, "0000:99:00.0"),
    ]


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
async def test_without_look_back_a_file_is_followed_from_its_end_across_rotation(
    tmp_path: Path, inotify: bool
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:1b:00): 48, old line before start\n")
    settings = KmsgSettings(
        file_poll_interval_s=0.005,
        file_poll_max_s=0.05,
        use_inotify=inotify,
        file_lookback_bytes=0,  # no read-back window
    )
    src = KmsgSource(str(log), settings, FakeClock())
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: src.ready, "the follower to attach")
        with log.open("a") as f:
            f.write("[ 1.0] NVRM: Xid (PCI:0000:1b:00): 79, pid=5, name=x, first\n")
            f.write("garbage\nNVRM: Xid (PCI:0000:1b:00): 13, pid=5, partial")
            f.flush()
            await until(lambda: len(out) == 1)
            f.write(" line\n")
        await until(lambda: len(out) == 2)
        log.rename(tmp_path / "kern.log.1")
        log.write_text("NVRM: Xid (PCI:0000:1b:00): 62, after rotation\n")
        await until(lambda: len(out) == 3)
    finally:
        task.cancel()
    xids = [o.xid for o in out if isinstance(o, XidObservation)]
    assert xids == [79, 13, 62]
    assert out[1].message == "partial line"  # type: ignore[union-attr]
    assert src.counters.value(KMSG_LINES) == 4


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
async def test_follow_file_truncated_in_place_and_created_late(
    tmp_path: Path, inotify: bool
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 200 + "\n")
    settings = KmsgSettings(file_poll_interval_s=0.005, file_poll_max_s=0.05, use_inotify=inotify)
    src = KmsgSource(str(log), settings, FakeClock())
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: src.ready, "the follower to attach")
        with log.open("r+") as f:  # copytruncate: same inode, shorter
            f.truncate(0)
        with log.open("a") as f:
            f.write("NVRM: Xid (PCI:0000:1b:00): 79, after truncation\n")
        await until(lambda: len(out) == 1)
        log.unlink()  # gone for a while, then back: read from its start
        log.write_text("NVRM: Xid (PCI:0000:1b:00): 64, recreated\n")
        await until(lambda: len(out) == 2)
    finally:
        task.cancel()
    assert [o.xid for o in out if isinstance(o, XidObservation)] == [79, 64]


def test_a_quiet_file_without_inotify_is_polled_with_backoff_up_to_the_max() -> None:
    waits: list[float] = []

    class Recorder(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return False

    ctx = ReaderContext(
        path="/nonexistent/kern.log",
        max_line_bytes=8192,
        select_timeout_s=0.5,
        file_poll_interval_s=0.01,
        file_poll_max_s=0.1,
        use_inotify=False,
        fingerprint_bytes=1024,
        attached=threading.Event(),
        counters=Counters(),
        overruns=KMSG_LINES,
        open_device=lambda _: 0,
    )
    waiter = _FileWaiter(ctx)
    stop = Recorder()
    for got in (False, False, False, False, False, True, False):
        waiter.wait(stop, got)
    assert waits == [0.01, 0.02, 0.04, 0.08, 0.1, 0.01, 0.02]


def test_inotify_is_used_where_the_kernel_has_it(tmp_path: Path) -> None:
    ino = open_inotify()
    if ino is None:
        pytest.skip("no inotify on this system")
    try:
        assert ino.watch(str(tmp_path), inotify.DIR_EVENTS)
        (tmp_path / "f").write_text("x")
        r, _, _ = select.select([ino.fd], [], [], 5)
        assert r and ino.drain() > 0
        assert ino.drain() == 0
        assert not ino.watch(str(tmp_path / "missing"), inotify.FILE_EVENTS)
    finally:
        ino.close()


def test_settings_bound_the_poll_intervals() -> None:
    with pytest.raises(SettingError) as exc:
        KmsgSettings(file_poll_interval_s=2.0, file_poll_max_s=1.0).check()
    assert exc.value.field == "file_poll_max_s"


async def test_follow_fifo_across_writers(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    src = KmsgSource(str(fifo), KmsgSettings(select_timeout_s=0.05), FakeClock())
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: src.ready, "the follower to attach")
        for xid in (79, 48):
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, f"NVRM: Xid (PCI:0000:1b:00): {xid}, pid=1, name=a, m\n".encode())
            os.close(fd)
        await until(lambda: len(out) == 2)
    finally:
        task.cancel()
    assert [o.xid for o in out if isinstance(o, XidObservation)] == [79, 48]


async def test_missing_path_fails_the_source() -> None:
    src = KmsgSource("/definitely/not/here", KmsgSettings(), FakeClock())
    with pytest.raises(TransientError, match="/definitely/not/here") as exc:
        await asyncio.wait_for(src.run(lambda _: None), 2)
    assert isinstance(exc.value.__cause__, FileNotFoundError)
    assert not src.up


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
async def test_dev_kmsg_is_followed() -> None:
    src = KmsgSource("/dev/kmsg", KmsgSettings(select_timeout_s=0.05), FakeClock())
    task = asyncio.create_task(src.run(lambda _: None))
    try:
        await until(lambda: src.ready or task.done(), "the follower to attach")
        if task.done():
            pytest.skip(f"/dev/kmsg not usable: {task.exception()}")
        assert src.ready and src.up
    finally:
        task.cancel()
