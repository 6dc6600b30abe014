"""The kernel-log follower's blocking side: its reader threads, where a followed file starts,
and Linux inotify.

Each reader hands lines to ``push`` (thread-safe, towards the event loop) until ``stop`` is
set, and sets ``attached`` once it follows. The policy (what a line means, what was handled
before) stays in :mod:`gpuhealth.agent.sources.kmsg.source`.

- /dev/kmsg: one record per ``read``; the reader starts at the oldest record still in the ring
  buffer (replay) and then blocks in ``select``. After the buffer has been read once it pushes
  :data:`CAUGHT_UP`. A record overwritten before it was read (EPIPE) is counted.
- FIFO: ``select`` on it, holding a write end so writers coming and going never give EOF.
- Regular file: ``tail -F`` from where the start plan says
  (:mod:`gpuhealth.agent.sources.kmsg.file_start`: the saved position, the read-back window;
  the rest of the saved file rotated away while the agent was down first; a large new file's
  head and end, its middle skipped), reopening when
  replaced or truncated. Each line carries its file's identity, its end offset and the file's
  fingerprint there (:class:`FileLine`), and :data:`CAUGHT_UP` follows the lines that were
  there at start. It waits for changes with inotify, re-checking at least every ``file_poll_max_s``;
  without inotify it polls, backing off (the one backoff, :mod:`gpuhealth.common.backoff`)
  from ``file_poll_interval_s`` to ``file_poll_max_s`` while the file is quiet.

inotify goes through ctypes (:mod:`gpuhealth.agent.sources.kmsg.libc`): one instance, watches
on a file and on its directory, a non-blocking descriptor to ``select`` on, and draining the
pending events (their content does not matter: after any event the follower re-checks the
file itself). Where inotify is missing (not Linux, no libc symbol, the per-user instance or
watch limit reached) :func:`open_inotify` returns None and the caller polls.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.sources.kmsg.file_start import (
    EMPTY,
    FileStart,
    Fingerprint,
    LinePrints,
    RotatedRest,
)
from gpuhealth.agent.sources.kmsg.libc import birth_time, libc
from gpuhealth.common.backoff import Backoff, BackoffPolicy

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000

FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
"""Written to, truncated (attrib), replaced or removed."""
DIR_EVENTS = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
"""A file (re)appearing or leaving the directory: rotation."""


class Inotify:
    """One inotify instance; close it when done."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc

    def watch(self, path: str, mask: int) -> bool:
        """Add a watch; False when the path cannot be watched (missing, or the limit)."""
        wd: int = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        return wd >= 0

    def drain(self) -> int:
        """Read and discard every pending event; how many bytes there were."""
        total = 0
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return total
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                return total
            total += len(chunk)

    def close(self) -> None:
        os.close(self.fd)


def open_inotify() -> Inotify | None:
    """A non-blocking inotify instance, or None where inotify cannot be used."""
    lib = libc()
    if lib is None:
        return None
    fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    return Inotify(fd, lib)


class CaughtUp:
    """Pushed once the ring buffer's existing records, or the lines a followed file held at
    start, have been read (not a line)."""


CAUGHT_UP: Final = CaughtUp()


@dataclass(frozen=True, slots=True)
class FileLine:
    """A line of a followed regular file, where it ends and who the file is."""

    text: str
    dev: int
    ino: int
    end: int
    """The offset after the line (and its newline): where the next line starts."""
    born: int | None = None
    """The file's birth time, where the filesystem keeps one."""
    fingerprint: Fingerprint | None = None
    """The file's content fingerprint at ``end``."""
    handed_ino: int = 0
    """The inode under which an earlier run would have written this line down as handed on:
    its file's, or for the rest of a copy of the saved file (copytruncate), the saved file's."""


Item = str | FileLine | BaseException | CaughtUp
Push = Callable[[Item], None]


@dataclass(frozen=True, slots=True)
class ReaderContext:
    path: str
    max_line_bytes: int
    select_timeout_s: float
    file_poll_interval_s: float
    file_poll_max_s: float
    use_inotify: bool
    fingerprint_bytes: int
    attached: threading.Event
    counters: Counters
    overruns: CounterSpec
    open_device: Callable[[str], int]
    """Opens /dev/kmsg non-blocking (tests hand in a SEQPACKET socket with the same shape)."""


def open_kmsg(path: str) -> int:
    """/dev/kmsg at its oldest record (a fresh open reads the whole ring buffer)."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def open_kmsg_at_end(path: str) -> int:
    """/dev/kmsg after its newest record (``kmsg.replay: false``)."""
    fd = open_kmsg(path)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def follow_kmsg(ctx: ReaderContext, push: Push, stop: threading.Event) -> None:
    """Every record from the oldest in the ring buffer on, one per read."""
    fd = ctx.open_device(ctx.path)
    caught_up = False
    try:
        ctx.attached.set()
        while not stop.is_set():
            while True:
                try:
                    rec = os.read(fd, ctx.max_line_bytes)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten before we read them
                        ctx.counters.inc(ctx.overruns)
                        continue
                    raise
                if not rec:
                    break
                for line in rec.decode("utf-8", "replace").splitlines():
                    if line and not line.startswith(" "):  # " KEY=value" continuation lines
                        push(line)
            if not caught_up:
                caught_up = True
                push(CAUGHT_UP)
            select.select([fd], [], [], ctx.select_timeout_s)
    finally:
        os.close(fd)


def follow_fifo(ctx: ReaderContext, push: Push, stop: threading.Event) -> None:
    fd = os.open(ctx.path, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(ctx.path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        ctx.attached.set()

        def wait(stop: threading.Event, got: bool) -> bool:
            select.select([fd], [], [], ctx.select_timeout_s)
            return False

        pump(ctx, fd, push, stop, wait=wait)
    finally:
        os.close(keep)
        os.close(fd)


class _FileWaiter:
    """Waits for a followed file to change: inotify (with a periodic re-check), else polling
    with backoff."""

    def __init__(self, ctx: ReaderContext) -> None:
        self._ctx = ctx
        self._ino: Inotify | None = open_inotify() if ctx.use_inotify else None
        self._watched = False
        self._backoff = Backoff(BackoffPolicy(ctx.file_poll_interval_s, ctx.file_poll_max_s))

    def rearm(self) -> None:
        """(Re)watch the file and its directory, after each (re)open."""
        ino = self._ino
        if ino is None:
            return
        # The directory's watch sees the file appear or be replaced; the file's, its writes.
        self._watched = ino.watch(os.path.dirname(os.path.abspath(self._ctx.path)), DIR_EVENTS)
        ino.watch(self._ctx.path, FILE_EVENTS)

    def wait(self, stop: threading.Event, got_data: bool) -> None:
        ctx = self._ctx
        if self._ino is not None and self._watched:
            ready, _, _ = select.select([self._ino.fd], [], [], ctx.file_poll_max_s)
            if ready:
                self._ino.drain()
            return
        if got_data:
            self._backoff.reset()
        stop.wait(self._backoff.next_delay())

    def close(self) -> None:
        if self._ino is not None:
            self._ino.close()


def follow_file(
    ctx: ReaderContext, push: Push, stop: threading.Event, start: FileStart | None
) -> None:
    """tail -F from ``start`` (None: the path is not a regular file yet); reopen when the
    file is replaced or truncated; a file that appears later is read from its start."""
    waiter = _FileWaiter(ctx)
    first = start is not None
    gap = start.gap if start is not None else None  # the planned file's, opened first
    try:
        if start is not None and start.rotated is not None:
            _read_rest(ctx, start.rotated, push)
        if start is None:
            push(CAUGHT_UP)
        while not stop.is_set():
            waiter.rearm()
            try:
                fd = os.open(ctx.path, os.O_RDONLY)
            except FileNotFoundError:
                ctx.attached.set()
                waiter.wait(stop, False)
                first, gap = False, None
                continue
            try:
                st = os.fstat(fd)
                offset = _first_offset(fd, st, start) if first and start is not None else 0
                os.lseek(fd, offset, os.SEEK_SET)
                caught_up = first
                first = False
                ctx.attached.set()

                def replaced(
                    ev: threading.Event, got: bool, fd: int = fd, ino: int = st.st_ino
                ) -> bool:
                    nonlocal caught_up
                    if caught_up:
                        caught_up = False
                        push(CAUGHT_UP)
                    try:
                        cur = os.stat(ctx.path)
                    except FileNotFoundError:
                        return True
                    if cur.st_ino != ino or cur.st_size < os.lseek(fd, 0, os.SEEK_CUR):
                        return True
                    waiter.wait(ev, got)
                    return False

                cursor = _cursor(ctx, fd, st, offset, handed_ino=st.st_ino)
                if offset == 0:  # the position follows the file from its start, lines or not
                    push(FileLine("", st.st_dev, st.st_ino, 0, cursor.born, EMPTY, st.st_ino))
                cursor = _past_gap(ctx, fd, st, cursor, gap=gap, push=push, stop=stop)
                gap = None
                pump(ctx, fd, push, stop, wait=replaced, cursor=cursor)
            finally:
                os.close(fd)
    finally:
        waiter.close()


def _first_offset(fd: int, st: os.stat_result, start: FileStart) -> int:
    """Where the first open of the file the plan was made for starts reading."""
    offset = min(start.offset, st.st_size)
    return _next_line(fd, offset) if start.lookback and offset > 0 else offset


def _past_gap(
    ctx: ReaderContext,
    fd: int,
    st: os.stat_result,
    cursor: _Cursor,
    *,
    gap: tuple[int, int] | None,
    push: Push,
    stop: threading.Event,
) -> _Cursor:
    """A new file's head up to ``gap``, then the cursor at its end part: the middle is not
    read (``FileStart.gap``). Nothing to skip (``gap`` None, or a file that is not as large
    as planned: read whole): ``cursor`` as it is."""
    if gap is None or cursor.offset > gap[0] or st.st_size < gap[1]:
        return cursor
    pump(ctx, fd, push, stop, wait=lambda _ev, _got: True, cursor=replace(cursor, end=gap[0]))
    os.lseek(fd, gap[1], os.SEEK_SET)
    return _cursor(ctx, fd, st, gap[1], handed_ino=st.st_ino)


def _next_line(fd: int, offset: int) -> int:
    """The start of the first whole line at or after ``offset``."""
    os.lseek(fd, offset - 1, os.SEEK_SET)
    skipped = 0
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return offset - 1 + skipped
        nl = chunk.find(b"\n")
        if nl >= 0:
            return offset + skipped + nl
        skipped += len(chunk)


def _read_rest(ctx: ReaderContext, rest: RotatedRest, push: Push) -> None:
    """The lines of the saved file (or its copy) beside a new one, from the saved offset to
    its end; nothing when it moved on meanwhile (another file at its name)."""
    try:
        fd = os.open(rest.path, os.O_RDONLY)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (rest.dev, rest.ino) or st.st_size < rest.offset:
            return
        os.lseek(fd, rest.offset, os.SEEK_SET)
        cursor = _cursor(ctx, fd, st, rest.offset, handed_ino=rest.saved_ino)
        pump(ctx, fd, push, threading.Event(), wait=lambda _ev, _got: True, cursor=cursor)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _Cursor:
    """A regular file being read: who it is, where reading started, its fingerprints."""

    dev: int
    ino: int
    born: int | None
    offset: int
    prints: LinePrints
    handed_ino: int
    end: int | None = None
    """Where reading stops (then the wait decides); None: the file's end."""


def _cursor(
    ctx: ReaderContext, fd: int, st: os.stat_result, offset: int, *, handed_ino: int
) -> _Cursor:
    limit = ctx.fingerprint_bytes
    head = os.pread(fd, min(limit, offset), 0) if offset > 0 else b""
    prints = LinePrints(head, offset, limit)
    return _Cursor(st.st_dev, st.st_ino, birth_time(fd), offset, prints, handed_ino)


def pump(
    ctx: ReaderContext,
    fd: int,
    push: Push,
    stop: threading.Event,
    *,
    wait: Callable[[threading.Event, bool], bool],
    cursor: _Cursor | None = None,
) -> None:
    """Read lines from ``fd`` until stopped; ``wait(stop, got_data)`` blocks when nothing is
    there and returns True when the file must be reopened. ``cursor``: a regular file and the
    offset read from: lines are pushed as :class:`FileLine`."""
    buf = b""
    limit = ctx.max_line_bytes
    got = False
    pos = cursor.offset if cursor is not None else 0
    """The offset of ``buf``'s first byte."""
    leaving = False
    end = cursor.end if cursor is not None else None
    while not stop.is_set():
        want = 65536 if end is None else min(65536, end - pos - len(buf))
        try:
            chunk = os.read(fd, want) if want > 0 else b""
        except BlockingIOError:
            chunk = b""
        if not chunk:
            if leaving:
                return
            # Replaced: read once more what a writer still appended to the old file before
            # it switched, then leave.
            leaving = wait(stop, got)
            got = False
            continue
        got = True
        buf += chunk
        *lines, buf = buf.split(b"\n")
        # A file's lines with their newline (what the fingerprint hashes); a FIFO's as read.
        whole = [raw + b"\n" for raw in lines] if cursor is not None else lines
        if len(buf) > limit:  # a runaway line without a newline
            lines.append(buf)
            if whole is not lines:
                whole.append(buf)
            buf = b""
        for raw, data in zip(lines, whole, strict=True):
            line = raw[:limit].decode("utf-8", "replace").rstrip("\r")
            if cursor is None:
                if line:
                    push(line)
                continue
            pos += len(data)
            c = cursor
            push(FileLine(line, c.dev, c.ino, pos, c.born, c.prints.line(data, pos), c.handed_ino))
