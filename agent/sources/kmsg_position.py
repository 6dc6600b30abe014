"""Where the kernel-log follower got to, kept in the state dir per boot: the last handled
/dev/kmsg sequence number, or a followed file's device, inode and offset.

/dev/kmsg numbers its records (``prio,SEQ,usec,flags;message``) from 0 at boot. The follower
reads the ring buffer from its oldest record at start, so XIDs logged while the agent was down
or restarting are seen; records up to the saved sequence number of the same boot were handled
by an earlier run and are skipped. A file from an earlier boot (or none) means: replay every
record of this boot.

A followed file resumes at the saved offset of the same inode (lines written while the agent
was down are read); a file shorter than the offset was truncated (read from its start); a
file with another inode was rotated: the rest of the old inode is read first where it is still
in the directory (``kern.log.1``), then the new file from its start. With no position of this
boot the follower reads back a bounded window (:func:`start_plan`).

Handing an XID to the sink and saving the position cannot be one atomic step, so the line
being handled is written down first (``pending``: its sequence number or end offset, with a
CRC of its text), and the position moves past it once the sink returned. A run that finds a
pending line of its own boot read it again as a *redelivery*: the engine drops it when the
verdict it would raise is already latched (restored from the latched store), so a crash
between the two writes handles the line at least once and counts it once.

The position is the ``kmsg_position`` document of the agent's state store
(:mod:`gpuhealth.agent.state_store`), per boot; saved while the engine driver handles an XID
it commits with that XID's outbox Event and latched verdict.
"""

from __future__ import annotations

import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")

NAME = "kmsg_position"


class FileMark(msgspec.Struct, frozen=True, kw_only=True):
    """A followed file's identity and the offset after its last handled line."""

    path: str
    dev: int
    ino: int
    offset: int


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """The line handed to the sink whose handling is not confirmed yet."""

    at: int
    """/dev/kmsg: its sequence number; a file: the offset after it."""
    crc: int
    """CRC-32 of the line's text: the same position with other text is another line."""


class PositionFile(msgspec.Struct, kw_only=True):
    seq: int | None = None
    file: FileMark | None = None
    pending: Pending | None = None


def line_crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "replace"))


class KmsgPosition:
    """What this boot's runs of the follower handled."""

    def __init__(self, store: StateStore | str | Path, boot_id: str) -> None:
        self._store = StateStore.of(store)
        self._boot_id = boot_id
        self._state = PositionFile()

    def load(self) -> PositionFile | None:
        """What an earlier run of this boot saved; None: nothing (replay / read back)."""
        raw, _ = self._store.boot_value(NAME, self._boot_id)
        if raw is None:
            return None
        try:
            saved = msgspec.json.decode(raw, type=PositionFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("kmsg_position_unreadable", error=str(exc))
            return None
        self._state = saved
        return saved

    def handling(self, at: int, text: str) -> None:
        """Before the sink: the line at ``at`` (sequence number or end offset) is handed over."""
        self._write(
            msgspec.structs.replace(self._state, pending=Pending(at=at, crc=line_crc(text)))
        )

    def save(self, seq: int) -> None:
        """Record /dev/kmsg record ``seq`` as handled (only forward)."""
        if self._state.seq is not None and seq <= self._state.seq:
            return
        self._write(msgspec.structs.replace(self._state, seq=seq, pending=self._past(seq)))

    def save_file(self, mark: FileMark) -> None:
        """Record a followed file as handled up to ``mark.offset``."""
        if mark == self._state.file and self._state.pending is None:
            return
        self._write(
            msgspec.structs.replace(self._state, file=mark, pending=self._past(mark.offset))
        )

    def _past(self, at: int) -> Pending | None:
        """The pending line, unless the position moves to or past it (a later XID may be
        pending while an earlier one is confirmed)."""
        pending = self._state.pending
        return None if pending is None or pending.at <= at else pending

    def _write(self, content: PositionFile) -> None:
        """An I/O error is logged, not raised: the worst case is that a restart reads those
        lines again."""
        if self._store.put_boot_value(NAME, self._boot_id, msgspec.json.encode(content)):
            self._state = content


@dataclass(frozen=True, slots=True)
class FileStart:
    """Where the reader thread starts a followed file."""

    offset: int
    """Where to start reading the file now at the path."""
    lookback: bool
    """``offset`` is the start of the read-back window (no position of this boot): skip the
    partial line there and the lines dated outside the window."""
    rotated: str | None = None
    """A rotated-away file holding our inode: read it from ``rotated_offset`` to its end
    first."""
    rotated_offset: int = 0


def file_identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def start_plan(path: str, saved: FileMark | None, lookback_bytes: int) -> FileStart | None:
    """Where to start following ``path`` (None: it is missing or not a regular file: the
    reader starts it as it appears).

    - the saved inode at ``path``: resume at its offset (from 0 when the file is shorter:
      truncated while the agent was down);
    - another inode: rotated while the agent was down; read the rest of the saved inode if a
      file in the same directory still has it, then ``path`` from its start;
    - no position: the last ``lookback_bytes`` of the file (0: its end)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if saved is not None and saved.path == path:
        if file_identity(st) == (saved.dev, saved.ino):
            return FileStart(
                offset=saved.offset if st.st_size >= saved.offset else 0, lookback=False
            )
        old = _find_inode(os.path.dirname(os.path.abspath(path)), saved.dev, saved.ino)
        return FileStart(offset=0, lookback=False, rotated=old, rotated_offset=saved.offset)
    return FileStart(offset=max(0, st.st_size - lookback_bytes), lookback=True)


def _find_inode(directory: str, dev: int, ino: int) -> str | None:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and file_identity(st) == (dev, ino):
            return entry.path
    return None
