"""The kernel-log follower's reader thread: blocking reads of /dev/kmsg, a FIFO or a file.

Each reader hands lines to ``push`` (thread-safe, towards the event loop) until ``stop`` is
set, and sets ``attached`` once it follows. The policy (what a line means, what was handled
before) stays in :mod:`gpuhealth.agent.sources.kmsg`.

- /dev/kmsg: one record per ``read``; the reader starts at the oldest record still in the ring
  buffer (replay) and then blocks in ``select``. After the buffer has been read once it pushes
  :data:`CAUGHT_UP`. A record overwritten before it was read (EPIPE) is counted.
- FIFO: ``select`` on it, holding a write end so writers coming and going never give EOF.
- Regular file: ``tail -F`` from where :func:`~gpuhealth.agent.sources.kmsg_position.start_plan`
  says (the saved position, the read-back window; the rest of a file rotated away while the
  agent was down first), reopening when replaced or truncated. Each line carries its file's
  device, inode and end offset (:class:`FileLine`), and :data:`CAUGHT_UP` follows the lines
  that were there at start. It waits for changes with inotify, re-checking at least every
  ``file_poll_max_s``; without inotify it polls, backing off from ``file_poll_interval_s`` to
  ``file_poll_max_s`` while the file is quiet.
"""

from __future__ import annotations

import errno
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.sources.inotify import DIR_EVENTS, FILE_EVENTS, Inotify, open_inotify
from gpuhealth.agent.sources.kmsg_position import FileStart


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
        self._delay = ctx.file_poll_interval_s

    @property
    def uses_inotify(self) -> bool:
        return self._ino is not None

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
        self._delay = (
            ctx.file_poll_interval_s if got_data else min(self._delay * 2, ctx.file_poll_max_s)
        )
        stop.wait(self._delay)

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
