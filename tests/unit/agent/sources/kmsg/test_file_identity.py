"""A followed file is more than its inode (the follower on real files, unit level): a file
created anew with the saved inode number and a line as long as the old one, a file copied
and truncated while the agent was down and grown back past the saved offset, a file created
anew with the very same bytes, and a position saved without a fingerprint."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from gpuhealth.agent.observations import Observation
from gpuhealth.agent.sources.kmsg.file_start import FileMark
from gpuhealth.agent.sources.kmsg.libc import birth_time
from gpuhealth.agent.sources.kmsg.source import (
    KMSG_FILE_MISMATCHES,
    KMSG_REDELIVERED,
    KMSG_XIDS,
    KmsgPosition,
    KmsgSource,
)
from tests.support.clock import FakeClock
from tests.support.kmsg_files import give_position_inode, recreate
from tests.support.wait import until
from tests.unit.agent.sources.kmsg.test_file_resume import (
    BOOT,
    NOW,
    append,
    follow,
    line,
    settings,
)


def _born(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return birth_time(fd)
    finally:
        os.close(fd)


async def test_a_file_created_anew_with_the_saved_inode_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    """The new file's line is as long as the handled one, so the file is exactly as long as
    the saved offset: resumed there, the line would be skipped."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    _, first = await follow(log, tmp_path, 1)
    assert [o.xid for o in first] == [79]
    old = log.stat().st_ino
    reused = recreate(log, line(48, 20).encode(), same_inode=True)
    if not reused:  # this filesystem did not hand the number out again: the position names it
        give_position_inode(tmp_path, BOOT, log)
    assert log.stat().st_size == len(line(79, 30))
    src, again = await follow(log, tmp_path, 1)
    assert [(o.xid, o.redelivered) for o in again] == [(48, False)]
    reason = "inode-reused" if _born(log) is not None else "fingerprint-mismatch"
    assert src.counters.by_label(KMSG_FILE_MISMATCHES) == {reason: 1}
    assert (log.stat().st_ino == old) is reused


async def test_a_file_created_anew_with_the_same_bytes_is_new_where_it_has_a_birth_time(
    tmp_path: Path,
) -> None:
    """The same line written again into a new file with the saved inode: only the birth time
    tells it from the handled one (content alone cannot)."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    if not recreate(log, line(79, 30).encode(), same_inode=True):
        give_position_inode(tmp_path, BOOT, log)
    if _born(log) is None:  # no birth time here: the same bytes are the same file
        src, again = await follow(log, tmp_path, 0, settle_s=0.2)
        assert again == [] and src.counters.by_label(KMSG_FILE_MISMATCHES) == {}
        return
    src, again = await follow(log, tmp_path, 1)
    assert [(o.xid, o.redelivered) for o in again] == [(79, False)]
    assert src.counters.by_label(KMSG_FILE_MISMATCHES) == {"inode-reused": 1}


async def test_a_file_copied_and_truncated_while_down_and_grown_back_past_the_offset(
    tmp_path: Path,
) -> None:
    """copytruncate while the agent is down: the copy's lines after the saved offset are read
    (found by the saved content), then the truncated file, grown back past the old offset
    with lines as long as the old ones, from its start; nothing twice."""
    log = tmp_path / "kern.log"
    log.write_text(line(13, 50) + line(31, 45))
    await follow(log, tmp_path, 2)
    append(log, line(43, 40))  # after the stop, before the copy: only in the copy
    shutil.copyfile(log, tmp_path / "kern.log.1")
    with log.open("r+") as f:
        f.truncate(0)
    append(log, line(48, 20), line(62, 15), line(64, 10))
    size = log.stat().st_size
    assert size > len(line(13, 50) + line(31, 45))  # past the saved offset
    src, again = await follow(log, tmp_path, 4)
    assert [(o.xid, o.redelivered) for o in again] == [
        (43, False),
        (48, False),
        (62, False),
        (64, False),
    ]
    assert src.counters.by_label(KMSG_FILE_MISMATCHES) == {"truncated": 1}
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None
    assert (saved.file.ino, saved.file.offset) == (log.stat().st_ino, size)


async def test_a_file_rotated_while_down_beside_a_new_one_with_its_inode_number_gone(
    tmp_path: Path,
) -> None:
    """kern.log renamed to kern.log.1 while down is finished first; kern.log.1 removed
    instead (nothing beside): the new file alone, from its start."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    append(log, line(48, 25))
    log.rename(tmp_path / "kern.log.1")
    log.write_text(line(62, 20))
    _, again = await follow(log, tmp_path, 2)
    assert [o.xid for o in again] == [48, 62]
    append(log, line(64, 15))
    (tmp_path / "kern.log.1").unlink()
    log.rename(tmp_path / "kern.log.1")
    (tmp_path / "kern.log.1").unlink()  # rotated and removed: nothing beside
    log.write_text(line(74, 10))
    _, last = await follow(log, tmp_path, 1)
    assert [o.xid for o in last] == [74]  # 64 went with the removed file


async def test_a_position_saved_without_a_fingerprint_reads_the_window_again_as_redeliveries(
    tmp_path: Path,
) -> None:
    """Saved by an agent that kept no fingerprint: nothing confirms the inode, so the window
    is read again and the engine drops what it already holds; the line after the old offset
    is not lost."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    st = log.stat()
    KmsgPosition(tmp_path, BOOT).save_file(
        FileMark(path=str(log), dev=st.st_dev, ino=st.st_ino, offset=st.st_size)
    )
    append(log, line(48, 20))
    src, obs = await follow(log, tmp_path, 2)
    assert [(o.xid, o.redelivered) for o in obs] == [(79, True), (48, True)]
    assert src.counters.value(KMSG_REDELIVERED) == 2 and src.counters.value(KMSG_XIDS) == 0
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None and saved.file.fingerprint is not None


async def _crash_with_xids_held(log: Path, state: Path, xids: int) -> None:
    """A run that hands ``xids`` XIDs on to an engine that holds them (no GPU inventory yet)
    and dies before it takes any: its position stays before the first, written down with
    the lines handed on since."""
    clock = FakeClock(NOW, monotonic_start=7200.0)
    src = KmsgSource(str(log), settings(), clock, position=KmsgPosition(state, BOOT))
    held: list[Observation] = []
    task = asyncio.create_task(src.run(held.append))
    try:
        await until(lambda: len(held) >= xids, f"{xids} XIDs handed on")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("before", [0, 1], ids=["first-line", "after-a-line"])
async def test_a_file_copied_and_truncated_after_a_crash_at_its_start_is_found_by_its_lines(
    tmp_path: Path, before: int
) -> None:
    """The run that read a new file from its start died after handing its first XID on
    (held by the engine) and before saving past it: its position is offset 0 (or the start of
    that line), which any file matches. The file copied and truncated while down and grown
    back: the copy holds the line handed on where it was, so it is the saved file's content:
    read from the saved offset (the handed line a redelivery, the lines after it fresh),
    then the regrown file."""
    log = tmp_path / "kern.log"
    log.write_text("eth0: link up\n" * before + line(79, 30))
    await _crash_with_xids_held(log, tmp_path, 1)
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None and len(saved.handed) == 1
    assert saved.file.offset == len("eth0: link up\n" * before)
    append(log, line(43, 25), line(31, 20))  # after the crash, before the copy
    shutil.copyfile(log, tmp_path / "kern.log.1")
    with log.open("r+") as f:
        f.truncate(0)
    append(log, line(48, 15), line(62, 10), line(64, 5), line(74, 1))  # grown back past it
    src, again = await follow(log, tmp_path, 7)
    assert [(o.xid, o.redelivered) for o in again] == [
        (79, True),
        (43, False),
        (31, False),
        (48, False),
        (62, False),
        (64, False),
        (74, False),
    ]
    assert src.counters.value(KMSG_REDELIVERED) == 1 and src.counters.value(KMSG_XIDS) == 6
    reason = "truncated" if _born(log) is not None else "fingerprint-mismatch"
    assert src.counters.by_label(KMSG_FILE_MISMATCHES) == {reason: 1}


async def test_the_saved_file_still_holding_the_lines_handed_on_resumes(tmp_path: Path) -> None:
    """The same crash, the file left as it was and grown: the handed line is where it was,
    so the file is the saved one, resumed at the saved offset (offset 0: from its start)."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await _crash_with_xids_held(log, tmp_path, 1)
    append(log, line(43, 25))
    src, again = await follow(log, tmp_path, 2)
    assert [(o.xid, o.redelivered) for o in again] == [(79, True), (43, False)]
    assert src.counters.by_label(KMSG_FILE_MISMATCHES) == {}


async def test_a_crash_while_reading_a_copy_redelivers_its_lines_once(tmp_path: Path) -> None:
    """copytruncate while down; the next run reads the copy's rest, then the regrown file,
    and dies with every XID handed on and held by the engine, its position still naming the
    saved file: the run after reads the copy again and knows its line as handed on (a
    redelivery), under whichever inode it was written down."""
    log = tmp_path / "kern.log"
    log.write_text(line(13, 50))
    await follow(log, tmp_path, 1)
    append(log, line(79, 40))  # after the stop: in the copy only
    shutil.copyfile(log, tmp_path / "kern.log.1")
    with log.open("r+") as f:
        f.truncate(0)
    append(log, line(48, 20), line(62, 15))
    await _crash_with_xids_held(log, tmp_path, 3)
    src, again = await follow(log, tmp_path, 3)
    assert [(o.xid, o.redelivered) for o in again] == [(79, True), (48, True), (62, True)]
    assert src.counters.value(KMSG_REDELIVERED) == 3 and src.counters.value(KMSG_XIDS) == 0
