"""The kernel-log follower's blocking side: its reader threads, where a followed file starts,
and Linux inotify.

Each reader hands lines to ``push`` (thread-safe, towards the event loop) until ``stop`` is
set, and sets ``attached`` once it follows. The policy (what a line means, what was handled
before) stays in :mod:`gpuhealth.agent.sources.kmsg.source`.

- /dev/kmsg: one record per ``read``; the reader starts at the oldest record still in the ring
  buffer (replay) and then blocks in ``select``. After the buffer has been read once it pushes
  :data:`CAUGHT_UP`. A record overwritten before it was read (EPIPE) is counted.
- FIFO: ``select`` on it, holding a write end so writers coming and going never give EOF.
- Regular file: ``tail -F`` from where :func:`start_plan` says (the saved position, the
  read-back window; the rest of a file rotated away while the agent was down first),
  reopening when replaced or truncated. Each line carries its file's device, inode and end
  offset (:class:`FileLine`), and :data:`CAUGHT_UP` follows the lines that were there at
  start. It waits for changes with inotify, re-checking at least every ``file_poll_max_s``;
  without inotify it polls, backing off (the one backoff, :mod:`gpuhealth.common.backoff`)
  from ``file_poll_interval_s`` to ``file_poll_max_s`` while the file is quiet.

inotify goes through ctypes (libc's inotify_init1 / inotify_add_watch): one instance, watches
on a file and on its directory, a non-blocking descriptor to ``select`` on, and draining the
pending events (their content does not matter: after any event the follower re-checks the
file itself). Where inotify is missing (not Linux, no libc symbol, the per-user instance or
watch limit reached) :func:`open_inotify` returns None and the caller polls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Final

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec
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


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


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
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    return Inotify(fd, libc)


class FileMark(msgspec.Struct, frozen=True, kw_only=True):
    """A followed file's identity and the offset after its last handled line."""

    path: str
    dev: int
    ino: int
    offset: int


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


class CaughtUp:
    """Pushed once the ring buffer's existing records, or the lines a followed file held at
    start, have been read (not a line)."""


CAUGHT_UP: Final = CaughtUp()


@dataclass(frozen=True, slots=True)
class FileLine:
    """A line of a followed regular file and where it ends."""

    text: str
    dev: int
    ino: int
    end: int
    """The offset after the line (and its newline): where the next line starts."""


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
    try:
        if start is not None and start.rotated is not None:
            _read_rest(ctx, start.rotated, start.rotated_offset, push)
        if start is None:
            push(CAUGHT_UP)
        while not stop.is_set():
            waiter.rearm()
            try:
                fd = os.open(ctx.path, os.O_RDONLY)
            except FileNotFoundError:
                ctx.attached.set()
                waiter.wait(stop, False)
                first = False
                continue
            try:
                st = os.fstat(fd)
                offset = 0
                if first and start is not None:
                    offset = min(start.offset, st.st_size)
                    if start.lookback and offset > 0:
                        offset = _next_line(fd, offset)
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

                pump(ctx, fd, push, stop, wait=replaced, mark=(st.st_dev, st.st_ino, offset))
            finally:
                os.close(fd)
    finally:
        waiter.close()


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


def _read_rest(ctx: ReaderContext, path: str, offset: int, push: Push) -> None:
    """The lines of a file rotated away while the agent was down, from ``offset`` to its end."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        offset = offset if st.st_size >= offset else 0
        os.lseek(fd, offset, os.SEEK_SET)
        pump(
            ctx,
            fd,
            push,
            threading.Event(),
            wait=lambda _ev, _got: True,
            mark=(st.st_dev, st.st_ino, offset),
        )
    finally:
        os.close(fd)


def pump(
    ctx: ReaderContext,
    fd: int,
    push: Push,
    stop: threading.Event,
    *,
    wait: Callable[[threading.Event, bool], bool],
    mark: tuple[int, int, int] | None = None,
) -> None:
    """Read lines from ``fd`` until stopped; ``wait(stop, got_data)`` blocks when nothing is
    there and returns True when the file must be reopened. ``mark``: a regular file's device,
    inode and the offset read from: lines are pushed as :class:`FileLine`."""
    buf = b""
    limit = ctx.max_line_bytes
    got = False
    pos = mark[2] if mark is not None else 0
    """The offset of ``buf``'s first byte."""
    leaving = False
    while not stop.is_set():
        try:
            chunk = os.read(fd, 65536)
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
        ends: list[int] = []
        for raw in lines:
            pos += len(raw) + 1
            ends.append(pos)
        if len(buf) > limit:  # a runaway line without a newline
            lines.append(buf[:limit])
            pos += len(buf)
            ends.append(pos)
            buf = b""
        for raw, end in zip(lines, ends, strict=True):
            line = raw[:limit].decode("utf-8", "replace").rstrip("\r")
            if mark is not None:
                push(FileLine(line, mark[0], mark[1], end))
            elif line:
                push(line)
