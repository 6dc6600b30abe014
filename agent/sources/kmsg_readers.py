"""The kernel-log follower's reader thread: blocking reads of /dev/kmsg, a FIFO or a file.

Each reader hands lines to ``push`` (thread-safe, towards the event loop) until ``stop`` is
set, and sets ``attached`` once it follows. The policy (what a line means, what was handled
before) stays in :mod:`gpuhealth.agent.sources.kmsg`.

- /dev/kmsg: one record per ``read``; the reader starts at the oldest record still in the ring
  buffer (replay) and then blocks in ``select``. After the buffer has been read once it pushes
  :data:`CAUGHT_UP`. A record overwritten before it was read (EPIPE) is counted.
- FIFO: ``select`` on it, holding a write end so writers coming and going never give EOF.
- Regular file: ``tail -F`` (start at the end, reopen when replaced or truncated). It waits for
  changes with inotify, re-checking at least every ``file_poll_max_s``; without inotify it polls,
  backing off from ``file_poll_interval_s`` to ``file_poll_max_s`` while the file is quiet.
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


class CaughtUp:
    """Pushed once the ring buffer's existing records have been read (not a line)."""


CAUGHT_UP: Final = CaughtUp()

Item = str | BaseException | CaughtUp
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
    ctx: ReaderContext, push: Push, stop: threading.Event, start: tuple[int, int] | None
) -> None:
    """tail -F: start at the end (``start``: inode and size when the source started); reopen
    when the file is replaced or truncated; a file that appears later is read from its start."""
    waiter = _FileWaiter(ctx)
    start_at_end = True
    try:
        while not stop.is_set():
            waiter.rearm()
            try:
                fd = os.open(ctx.path, os.O_RDONLY)
            except FileNotFoundError:
                ctx.attached.set()
                waiter.wait(stop, False)
                start_at_end = False
                continue
            try:
                st = os.fstat(fd)
                if start_at_end and start is not None and start[0] == st.st_ino:
                    os.lseek(fd, min(start[1], st.st_size), os.SEEK_SET)
                elif start_at_end:
                    os.lseek(fd, 0, os.SEEK_END)
                start_at_end = False
                ctx.attached.set()

                def replaced(
                    ev: threading.Event, got: bool, fd: int = fd, ino: int = st.st_ino
                ) -> bool:
                    try:
                        cur = os.stat(ctx.path)
                    except FileNotFoundError:
                        return True
                    if cur.st_ino != ino or cur.st_size < os.lseek(fd, 0, os.SEEK_CUR):
                        return True
                    waiter.wait(ev, got)
                    return False

                pump(ctx, fd, push, stop, wait=replaced)
            finally:
                os.close(fd)
    finally:
        waiter.close()


def pump(
    ctx: ReaderContext,
    fd: int,
    push: Push,
    stop: threading.Event,
    *,
    wait: Callable[[threading.Event, bool], bool],
) -> None:
    """Read lines from ``fd`` until stopped; ``wait(stop, got_data)`` blocks when nothing is
    there and returns True when the file must be reopened."""
    buf = b""
    limit = ctx.max_line_bytes
    got = False
    while not stop.is_set():
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            chunk = b""
        if not chunk:
            if wait(stop, got):
                return
            got = False
            continue
        got = True
        buf += chunk
        *lines, buf = buf.split(b"\n")
        if len(buf) > limit:  # a runaway line without a newline
            lines.append(buf[:limit])
            buf = b""
        for raw in lines:
            line = raw[:limit].decode("utf-8", "replace").rstrip("\r")
            if line:
                push(line)
