"""Where a followed kernel-log file starts after a restart, and how the file the position was
saved for is told from another one.

**A file's identity** (:class:`FileMark`, saved per boot with the follower's position) is its
device, its inode, its birth time where the filesystem keeps one (``statx``), and a
fingerprint of its content (:class:`Fingerprint`): a hash of its first bytes (up to
``kmsg.file_fingerprint_bytes``, never past the saved offset) and a hash of the line just
before the saved offset (its last ``file_fingerprint_bytes`` at most), as log shippers
(Filebeat, Fluent Bit) tell a new file from an old one. An inode number alone says little: on
ext4 a freed number is handed out again, so a log removed and created anew while the agent is
down can carry the saved inode, and once as long as the saved offset it would be resumed at
its end, after the lines it should have read. The file at the path is the saved one only
when the device and inode match, its birth time matches (where both are known), it is at
least as long as the saved offset, and both hashes, computed again over the saved lengths,
match. Reading them costs two bounded reads (never the whole file). The mark also keeps when
it was saved (``saved_at``).

**What the saved file held past its offset.** A run that dies after handing a line on and
before the engine took it leaves its position before that line, possibly at offset 0 (the
first line of a file it read from its start), where a fingerprint holds nothing and every
file matches. The first such line was written down with the position: the mark after it
(``reached``, the same file, its fingerprint over that line). The saved file, or a copy of
it, still holds that line where it was; a file truncated and grown back, or created anew,
does not. So a file is the saved one only when it holds both the mark's content and, where
one was written down, the reached mark's (two more bounded reads).

**The plan** (:func:`start_plan`, pure over :class:`FileView` ports and :class:`StartBounds`;
:func:`plan_file` opens them):

- no position of this boot (or one for another path): the first start's read-back window, the
  last ``file_lookback_bytes``; lines dated more than ``file_lookback_s`` before now, or
  before this boot, are skipped;
- the saved file at the path (holding its reached line too): resume at the saved offset
  (lines after it dated more than ``file_lookback_s`` before the save, which only a log
  restored in place can hold, are skipped as below; none by a mark that kept no time);
- another file at the path: read from its start. The saved file was renamed away, removed,
  or truncated since, and the lines written after that are at its start: they are never
  skipped, however long the agent was down. Such a file may also carry old history (a log
  restored or copied into place): lines dated more than ``file_lookback_s`` before the
  moment the position was saved (never later than now), or before this boot, are history the
  previous run had already passed, and are skipped. A mark saved by an agent that kept no
  ``saved_at`` falls back to now: lines written during a downtime longer than
  ``file_lookback_s`` before such an upgrade are then skipped like a first start's: it errs
  towards skipping rather than reading history twice, and only once, at the upgrade. A line
  an earlier run handed on and never confirmed is never history. A file larger than
  ``file_new_head_bytes`` + ``file_lookback_bytes`` is not read whole: its first
  ``file_new_head_bytes`` (to the end of the line there) and its last ``file_lookback_bytes``
  (from the first whole line) are; the middle is skipped, logged and counted.
  Before it, the rest of the saved file is read from the saved offset where it is still beside
  it: renamed (``kern.log.1``: the saved inode, verified like the file at the path) or copied
  (``copytruncate``: a file named after the followed one that holds the saved content; only
  content can tell a copy, so at offset 0 only a reached line can). Why the file at the path
  is another one is the plan's ``reason``: ``rotated`` (another inode), ``inode-reused`` (the
  saved inode, born later), ``truncated`` (shorter than the saved offset or the reached line's
  end, or the same birth time with other content: truncated and written again),
  ``fingerprint-mismatch`` (other content where no birth time tells more);
- a position saved by an agent that kept no fingerprint, on the same inode and long enough:
  nothing can confirm it, so the read-back window is read again, each line as a
  *redelivery* (the engine drops those whose verdict it already holds): nothing is lost, at
  the cost of re-reading the window once, after an upgrade.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol

import msgspec

from gpuhealth.agent.sources.kmsg.libc import birth_time
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings

StartReason = Literal[
    "first-start",
    "resumed",
    "rotated",
    "inode-reused",
    "truncated",
    "fingerprint-mismatch",
    "unverified",
]
MISMATCHES: frozenset[StartReason] = frozenset(
    {"inode-reused", "truncated", "fingerprint-mismatch"}
)
"""Reasons for which the file at the path had the saved inode but was another file."""


def content_hash(data: bytes) -> int:
    """A 64-bit hash of ``data`` (BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Fingerprint(msgspec.Struct, frozen=True, kw_only=True):
    """A file's content at a saved offset: hashes of its first ``head_len`` bytes and of the
    ``tail_len`` bytes before the offset (the end of the last line read)."""

    head_len: int
    head: int
    tail_len: int
    tail: int


class FileMark(msgspec.Struct, frozen=True, kw_only=True):
    """A followed file's identity and the offset after its last handled line."""

    path: str
    dev: int
    ino: int
    offset: int
    born: int | None = None
    """Its birth time (ns), where the filesystem keeps one."""
    fingerprint: Fingerprint | None = None
    """None: saved by an agent that kept no fingerprint."""
    saved_at: datetime | None = None
    """When the position was saved (wall clock); None: saved by an agent that kept no time
    (a file that is not the saved one then dates its history from now instead)."""


@dataclass(frozen=True, slots=True)
class RotatedRest:
    """The saved file (or its copy) beside the new one: read from ``offset`` to its end."""

    path: str
    dev: int
    ino: int
    offset: int
    saved_ino: int
    """The inode the position was saved for (a copy's lines were written down under it)."""


@dataclass(frozen=True, slots=True)
class FileStart:
    """Where the reader thread starts a followed file, and why."""

    offset: int
    """Where to start reading the file now at the path."""
    lookback: bool
    """``offset`` is the start of the read-back window: skip the partial line there."""
    reason: StartReason
    rotated: RotatedRest | None = None
    """The rest of the saved file, read first."""
    redeliver: bool = False
    """The window's lines are redeliveries (a position that could not be verified)."""
    history_before: datetime | None = None
    """Lines read before the follower caught up (the rest of the saved file, then this file
    to its end at start) dated before this are history, skipped; None: none are (the saved
    file resumed from a mark that kept no time)."""
    dated_from: datetime | None = None
    """What ``history_before`` counts from (``file_lookback_s`` before it): the ``saved_at``
    of the marks the follower saves before it caught up, since the lines past them, not read
    yet, may be as old as this start lets through (stamped with the time of the save, a
    crash there would make them history for the next start); None where
    ``history_before`` is."""
    gap: tuple[int, int] | None = None
    """``(start, end)``: bytes of this file that are not read, both at a line's start: the
    middle of a new file larger than ``file_new_head_bytes`` + ``file_lookback_bytes``."""


@dataclass(frozen=True, slots=True)
class StartBounds:
    """What a start may read (``kmsg.file_lookback_*``, ``file_new_head_bytes``), decided
    at ``now`` in a boot that began at ``booted``."""

    lookback_bytes: int
    lookback_s: float
    new_head_bytes: int
    now: datetime
    booted: datetime

    @classmethod
    def of(cls, settings: KmsgSettings, now: datetime, monotonic_s: float) -> StartBounds:
        """``monotonic_s``: the monotonic clock (seconds since boot) at ``now``."""
        return cls(
            lookback_bytes=settings.file_lookback_bytes,
            lookback_s=settings.file_lookback_s,
            new_head_bytes=settings.file_new_head_bytes,
            now=now,
            booted=now - timedelta(seconds=monotonic_s),
        )

    def dated(self, saved_at: datetime | None) -> datetime:
        """What history is dated from: ``saved_at`` (None, or later than now: now)."""
        return self.now if saved_at is None else min(saved_at, self.now)

    def history_before(self, saved_at: datetime | None) -> datetime:
        """Lines dated before this are history: more than ``lookback_s`` before ``saved_at``
        (:meth:`dated`), or before this boot."""
        return max(self.dated(saved_at) - timedelta(seconds=self.lookback_s), self.booted)


class FileView(Protocol):
    """A file as the plan looks at it: who it is, how long, and bounded reads of it."""

    @property
    def path(self) -> str: ...
    @property
    def dev(self) -> int: ...
    @property
    def ino(self) -> int: ...
    @property
    def born(self) -> int | None: ...
    @property
    def size(self) -> int: ...
    def read(self, offset: int, length: int) -> bytes: ...


def holds_content(view: FileView, mark: FileMark) -> bool:
    """``view`` holds the saved content up to the mark's offset: both hashes match over the
    saved lengths (two reads of at most ``file_fingerprint_bytes`` each)."""
    fp = mark.fingerprint
    if fp is None or view.size < mark.offset:
        return False
    if not 0 <= fp.head_len <= mark.offset or not 0 <= fp.tail_len <= mark.offset:
        return False
    head = view.read(0, fp.head_len)
    tail = view.read(mark.offset - fp.tail_len, fp.tail_len)
    return (len(head), len(tail)) == (fp.head_len, fp.tail_len) and (
        content_hash(head),
        content_hash(tail),
    ) == (fp.head, fp.tail)


def reached_past(saved: FileMark, reached: FileMark | None) -> FileMark | None:
    """``reached`` where it describes the saved file past the saved offset (the same path,
    device and inode, further, with a fingerprint); else None."""
    if reached is None or reached.fingerprint is None or reached.offset <= saved.offset:
        return None
    same = (reached.path, reached.dev, reached.ino) == (saved.path, saved.dev, saved.ino)
    return reached if same else None


def holds_saved(view: FileView, saved: FileMark, reached: FileMark | None) -> bool:
    """``view`` holds the saved file's content: up to the saved offset, and up to the end of
    the line handed on past it where one was written down (``reached``, as
    :func:`reached_past` gives it)."""
    return holds_content(view, saved) and (reached is None or holds_content(view, reached))


def _born_differs(view: FileView, mark: FileMark) -> bool:
    return view.born is not None and mark.born is not None and view.born != mark.born


def is_saved_file(view: FileView, mark: FileMark, reached: FileMark | None = None) -> bool:
    """``view`` is the file the mark was saved for: same device and inode, same birth time
    where both are known, and the saved content (:func:`holds_saved`)."""
    same = (view.dev, view.ino) == (mark.dev, mark.ino) and not _born_differs(view, mark)
    return same and holds_saved(view, mark, reached)


def mismatch_reason(view: FileView, mark: FileMark) -> StartReason:
    """Why the file with the saved inode is another file (``mark``: the furthest evidence,
    the reached mark where there is one)."""
    if _born_differs(view, mark):
        return "inode-reused"
    if view.size < mark.offset or (view.born is not None and mark.born is not None):
        return "truncated"
    return "fingerprint-mismatch"


def start_plan(
    path: str,
    saved: FileMark | None,
    current: FileView | None,
    siblings: Callable[[], Iterable[FileView]],
    bounds: StartBounds,
    *,
    reached: FileMark | None = None,
) -> FileStart | None:
    """Where to start following ``path`` (``current``: the file there; None: missing or not a
    regular file, the reader starts it as it appears). ``siblings``: the other files of the
    directory, asked for only when the saved file is not at the path. ``reached``: the mark
    after the first line handed on past ``saved`` and never confirmed, written down with it."""
    if current is None:
        return None
    window = max(0, current.size - bounds.lookback_bytes)
    recent = bounds.history_before(None)
    if saved is None or saved.path != path:
        return FileStart(
            offset=window,
            lookback=True,
            reason="first-start",
            history_before=recent,
            dated_from=bounds.now,
        )
    same_inode = (current.dev, current.ino) == (saved.dev, saved.ino)
    if same_inode and saved.fingerprint is None and current.size >= saved.offset:
        return FileStart(
            offset=window,
            lookback=True,
            reason="unverified",
            redeliver=True,
            history_before=recent,
            dated_from=bounds.now,
        )
    reached = reached_past(saved, reached)
    if same_inode and is_saved_file(current, saved, reached):
        # What follows the offset was written since; history only if restored in place.
        dated = saved.saved_at is not None
        return FileStart(
            offset=saved.offset,
            lookback=False,
            reason="resumed",
            history_before=bounds.history_before(saved.saved_at) if dated else None,
            dated_from=bounds.dated(saved.saved_at) if dated else None,
        )
    return FileStart(
        offset=0,
        lookback=False,
        reason=mismatch_reason(current, reached or saved) if same_inode else "rotated",
        rotated=_rest(saved, reached, siblings()),
        history_before=bounds.history_before(saved.saved_at),
        dated_from=bounds.dated(saved.saved_at),
        gap=_gap(current, bounds),
    )


LINE_SCAN_BYTES = 1 << 20
"""The most read to find where a line ends (``kmsg.max_line_bytes`` at its largest: longer
lines are cut there anyway)."""


def _line_start(view: FileView, offset: int) -> int:
    """The start of the first whole line at or after ``offset`` (the file's end, or
    ``LINE_SCAN_BYTES`` on, when no newline comes)."""
    if offset <= 0:
        return 0
    at, end = offset - 1, min(view.size, offset - 1 + LINE_SCAN_BYTES)
    while at < end:
        chunk = view.read(at, min(4096, end - at))
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        at += len(chunk)
    return max(offset, at)


def _gap(view: FileView, bounds: StartBounds) -> tuple[int, int] | None:
    """The middle of a new file that is not read: after its first ``new_head_bytes`` (to the
    end of the line there), before its last ``lookback_bytes`` (from the first whole line)."""
    if view.size <= bounds.new_head_bytes + bounds.lookback_bytes:
        return None
    head_end = _line_start(view, bounds.new_head_bytes)
    tail = _line_start(view, max(head_end, view.size - bounds.lookback_bytes))
    return (head_end, tail) if tail > head_end else None


def _rest(
    saved: FileMark, reached: FileMark | None, siblings: Iterable[FileView]
) -> RotatedRest | None:
    """Where the saved file's content still is beside the new one: the saved file renamed
    (its inode, verified where a fingerprint was saved), else a copy of it (only content can
    tell a copy: at offset 0 with no line reached past it, any file would match)."""
    copy: FileView | None = None
    telling = saved.offset > 0 or reached is not None
    for view in siblings:
        if (view.dev, view.ino) == (saved.dev, saved.ino):
            if saved.fingerprint is None or is_saved_file(view, saved, reached):
                return RotatedRest(view.path, view.dev, view.ino, saved.offset, saved.ino)
        elif copy is None and telling and view.dev == saved.dev:
            copy = view if holds_saved(view, saved, reached) else None
    if copy is None:
        return None
    return RotatedRest(copy.path, copy.dev, copy.ino, saved.offset, saved.ino)


# ----------------------------------------------------------------------- the files themselves


class OpenFile:
    """A :class:`FileView` of a file open for reading; close it when done."""

    def __init__(self, path: str) -> None:
        """Raises OSError when the file cannot be opened."""
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self._fd)
        self.dev, self.ino, self.size, self.mode = st.st_dev, st.st_ino, st.st_size, st.st_mode
        self.born = birth_time(self._fd)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset) if length > 0 else b""

    def close(self) -> None:
        os.close(self._fd)


def _open_regular(path: str) -> OpenFile | None:
    try:
        view = OpenFile(path)
    except OSError:
        return None
    if not stat.S_ISREG(view.mode):
        view.close()
        return None
    return view


def _siblings(
    path: str, saved: FileMark, reached: FileMark | None, opened: list[OpenFile]
) -> Iterator[FileView]:
    """The directory's other regular files that may hold the saved content: the saved inode
    under any name, or (for a copy) a file named after the followed one, on its device, at
    least as long as the saved offset (and the reached line's end)."""
    least = reached.offset if reached is not None else saved.offset
    directory, base = os.path.split(os.path.abspath(path))
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name == base:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_dev != saved.dev:
            continue
        if st.st_ino != saved.ino and not (
            saved.fingerprint is not None and entry.name.startswith(base) and st.st_size >= least
        ):
            continue
        view = _open_regular(entry.path)
        if view is not None:
            opened.append(view)
            yield view


def plan_file(
    path: str, saved: FileMark | None, bounds: StartBounds, reached: FileMark | None = None
) -> FileStart | None:
    """:func:`start_plan` for the file at ``path`` and its directory on disk."""
    current = _open_regular(path)
    opened: list[OpenFile] = []

    def siblings() -> Iterator[FileView]:
        assert saved is not None  # the plan asks only about a saved file
        return _siblings(path, saved, reached_past(saved, reached), opened)

    try:
        return start_plan(path, saved, current, siblings, bounds, reached=reached)
    finally:
        for view in (current, *opened):
            if view is not None:
                view.close()


EMPTY = Fingerprint(head_len=0, head=content_hash(b""), tail_len=0, tail=content_hash(b""))
"""The fingerprint at offset 0: nothing read yet, nothing to compare."""


class LinePrints:
    """The fingerprint at the end of each line of one file, kept by the reader thread as it
    reads (``limit``, ``file_fingerprint_bytes``: the most of the head and of a line hashed)."""

    def __init__(self, head: bytes, offset: int, limit: int) -> None:
        """``offset``: where reading starts; ``head``: the file's first ``min(limit,
        offset)`` bytes."""
        self._limit = limit
        self._head = bytearray(head[: min(limit, offset)])
        self._at = offset
        """The offset after the bytes read so far."""
        self._full: tuple[int, int] | None = None
        """(length, hash) of the whole head once it is ``limit`` bytes."""

    def line(self, raw: bytes, end: int) -> Fingerprint:
        """The fingerprint after a line whose bytes (its newline included) are ``raw``, ending
        at ``end``."""
        limit = self._limit
        if len(self._head) < limit and end - len(raw) == len(self._head) == self._at:
            self._head += raw[: limit - len(self._head)]
        self._at = end
        tail = raw[-limit:]
        if self._full is not None:
            head_len, head = self._full
        else:
            head_len = min(len(self._head), end)
            head = content_hash(bytes(self._head[:head_len]))
            if head_len == limit:
                self._full = (head_len, head)
        return Fingerprint(
            head_len=head_len, head=head, tail_len=len(tail), tail=content_hash(tail)
        )
