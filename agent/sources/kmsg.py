"""Kernel-log follower: ``NVRM: Xid`` lines from /dev/kmsg, a log file or a FIFO.

Blocking reads happen in a dedicated thread; lines reach the event loop through a bounded
queue (a full queue drops and counts lines). Each line is parsed
(:mod:`gpuhealth.agent.sources.kmsg_parser`), its PCI address mapped to a GPU UUID, and an
:class:`~gpuhealth.agent.observations.XidObservation` handed to the sink. Garbage is counted,
never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import stat
import threading
from collections.abc import Callable
from typing import Annotated

from msgspec import Meta

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import ObservationSink, SourceName, XidObservation
from gpuhealth.agent.sources.kmsg_parser import parse_line, strip_prefix
from gpuhealth.common.clock import Clock
from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")


class KmsgSettings(Settings, frozen=True, kw_only=True):
    file_poll_interval_s: PositiveSeconds = 0.01
    """How often a regular file is checked for new lines (tail -F)."""
    select_timeout_s: PositiveSeconds = 0.5
    """How long one wait on /dev/kmsg or a FIFO lasts before the reader checks for stop."""
    max_line_bytes: Annotated[int, Meta(ge=256, le=1 << 20)] = 8192
    """Longer lines are cut (a /dev/kmsg record is at most 8 KiB)."""
    queue_max: PositiveInt = 10_000
    """Lines waiting for the event loop; beyond this, lines are dropped and counted."""


KMSG_LINES = CounterSpec("kmsg_lines", "Kernel-log lines read.")
KMSG_MALFORMED = CounterSpec(
    "kmsg_malformed_lines", "NVRM Xid lines that did not parse, or PCI addresses not mapped."
)
KMSG_XIDS = CounterSpec("kmsg_xids", "XIDs read from the kernel log.")
KMSG_UNMAPPED = CounterSpec(
    "kmsg_unmapped_xids",
    "Kernel-log XIDs whose PCI address matched no known GPU (also counted as malformed).",
)
KMSG_DROPPED = CounterSpec(
    "kmsg_dropped_lines",
    "Kernel-log lines dropped because the agent fell behind (queue_max lines waiting): "
    "XIDs may have been lost.",
)
KMSG_OVERRUNS = CounterSpec(
    "kmsg_overruns",
    "Times the kernel ring buffer wrapped before /dev/kmsg was read (EPIPE): records, "
    "possibly XIDs, were lost.",
)


class KmsgSource:
    """Follows the kernel log and reports XIDs (a :class:`~gpuhealth.agent.sources.base.Source`).

    Up while it follows the log (a quiet log is not a failure); ready once it is positioned
    at the end of the log, so that every line written from then on is seen.
    """

    name: SourceName = "kmsg"

    def __init__(
        self,
        path: str,
        settings: KmsgSettings,
        clock: Clock,
        pci_to_uuid: Callable[[str], str | None],
    ) -> None:
        self.path = path
        self.settings = settings
        self._clock = clock
        self._pci_to_uuid = pci_to_uuid
        self.counters = Counters(
            KMSG_LINES, KMSG_MALFORMED, KMSG_XIDS, KMSG_UNMAPPED, KMSG_DROPPED, KMSG_OVERRUNS
        )
        self.errors = 0
        self.polls: Histogram | None = None
        self._attached = threading.Event()
        """Set by the reader thread once it is positioned at the end and following."""
        self._failed = False

    @property
    def ready(self) -> bool:
        return self._attached.is_set()

    @property
    def up(self) -> bool:
        return self._attached.is_set() and not self._failed

    def handle_line(self, line: str, sink: ObservationSink) -> None:
        """Count and parse one line; emit an XidObservation for a good one."""
        self.counters.inc(KMSG_LINES)
        if "NVRM: Xid" not in line:
            return
        try:
            parsed = parse_line(strip_prefix(line))
        except Exception:  # a parser bug must never stop the follower
            parsed = None
        if parsed is None:
            self.counters.inc(KMSG_MALFORMED)
            return
        uuid = self._pci_to_uuid(parsed.pci_bus_id)
        if uuid is None:
            self.counters.inc(KMSG_UNMAPPED)
            self.counters.inc(KMSG_MALFORMED)
        self.counters.inc(KMSG_XIDS)
        sink(
            XidObservation(
                source="kmsg",
                xid=parsed.xid,
                at=self._clock.now(),
                uuid=uuid,
                pci_bus_id=parsed.pci_bus_id,
                pid=parsed.pid,
                process_name=parsed.process_name,
                message=parsed.message[:512],
                gpu_instance=parsed.gpu_instance,
                compute_instance=parsed.compute_instance,
            )
        )

    async def run(self, sink: ObservationSink) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | BaseException] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: str | BaseException) -> None:
            if queue.qsize() >= self.settings.queue_max and isinstance(item, str):
                self.counters.inc(KMSG_DROPPED)
                return
            queue.put_nowait(item)

        def push(item: str | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(deliver, item)

        self._attached.clear()
        self._failed = False
        start = self._file_end()
        reader = threading.Thread(
            target=self._reader,
            args=(push, stop, start),
            name=f"kmsg-reader:{self.path}",
            daemon=True,
        )
        reader.start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    self._failed = True
                    raise item
                self.handle_line(item, sink)
        finally:
            stop.set()

    # ----------------------------------------------------------------- reader thread

    def _file_end(self) -> tuple[int, int] | None:
        """(inode, size) of a regular file now, so lines written while the reader thread
        starts are not lost."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size) if stat.S_ISREG(st.st_mode) else None

    def _reader(
        self,
        push: Callable[[str | BaseException], None],
        stop: threading.Event,
        start: tuple[int, int] | None,
    ) -> None:
        try:
            mode = os.stat(self.path).st_mode
            if stat.S_ISCHR(mode):
                self._follow_kmsg(push, stop)
            elif stat.S_ISFIFO(mode):
                self._follow_fifo(push, stop)
            else:
                self._follow_file(push, stop, start)
        except Exception as exc:  # reported to the supervisor through run()
            err = TransientError(f"kernel log {self.path}: {exc}")
            err.__cause__ = exc
            push(err)

    def _follow_kmsg(
        self, push: Callable[[str | BaseException], None], stop: threading.Event
    ) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)
            self._attached.set()
            while not stop.is_set():
                r, _, _ = select.select([fd], [], [], self.settings.select_timeout_s)
                if not r:
                    continue
                while True:
                    try:
                        rec = os.read(fd, self.settings.max_line_bytes)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno == errno.EPIPE:  # records overwritten before we read them
                            self.counters.inc(KMSG_OVERRUNS)
                            continue
                        raise
                    if not rec:
                        break
                    for line in rec.decode("utf-8", "replace").splitlines():
                        if line and not line.startswith(" "):  # " KEY=value" continuation lines
                            push(line)
        finally:
            os.close(fd)

    def _follow_fifo(
        self, push: Callable[[str | BaseException], None], stop: threading.Event
    ) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        # Holding a write end ourselves means writers coming and going never give us EOF.
        keep = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            self._attached.set()
            self._pump(fd, push, stop, wait=self._select_wait(fd))
        finally:
            os.close(keep)
            os.close(fd)

    def _select_wait(self, fd: int) -> Callable[[threading.Event], bool]:
        def wait(stop: threading.Event) -> bool:
            select.select([fd], [], [], self.settings.select_timeout_s)
            return False

        return wait

    def _follow_file(
        self,
        push: Callable[[str | BaseException], None],
        stop: threading.Event,
        start: tuple[int, int] | None,
    ) -> None:
        """tail -F: start at the current end; reopen when the file is replaced or truncated."""
        interval = self.settings.file_poll_interval_s
        start_at_end = True
        while not stop.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                self._attached.set()
                stop.wait(interval)
                start_at_end = False  # a file that appears later is read from its start
                continue
            try:
                st = os.fstat(fd)
                if start_at_end and start is not None and start[0] == st.st_ino:
                    os.lseek(fd, min(start[1], st.st_size), os.SEEK_SET)
                elif start_at_end:
                    os.lseek(fd, 0, os.SEEK_END)
                start_at_end = False
                self._attached.set()

                def rotated(ev: threading.Event, fd: int = fd, ino: int = st.st_ino) -> bool:
                    ev.wait(interval)
                    try:
                        cur = os.stat(self.path)
                    except FileNotFoundError:
                        return True
                    return cur.st_ino != ino or cur.st_size < os.lseek(fd, 0, os.SEEK_CUR)

                self._pump(fd, push, stop, wait=rotated)
            finally:
                os.close(fd)

    def _pump(
        self,
        fd: int,
        push: Callable[[str | BaseException], None],
        stop: threading.Event,
        *,
        wait: Callable[[threading.Event], bool],
    ) -> None:
        """Read lines from ``fd`` until stopped; ``wait`` blocks when nothing is there and
        returns True when the file must be reopened."""
        buf = b""
        limit = self.settings.max_line_bytes
        while not stop.is_set():
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                if wait(stop):
                    return
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            if len(buf) > limit:  # a runaway line without a newline
                lines.append(buf[:limit])
                buf = b""
            for raw in lines:
                line = raw[:limit].decode("utf-8", "replace").rstrip("\r")
                if line:
                    push(line)
