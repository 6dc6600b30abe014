"""Kernel-log follower: ``NVRM: Xid`` lines from /dev/kmsg, a log file or a FIFO.

Accepts /dev/kmsg records (``prio,seq,ts_us,flags;message``), dmesg lines with a ``[time]``
prefix, and syslog lines. The XID line is
``NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``;
older drivers omit ``name=``, the pid may be ``'<unknown>'``, and the PCI address contains
digits, so the code is anchored after the ``)``. Garbage is counted, never raised.

Blocking reads happen in a dedicated thread; lines reach the event loop through a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import select
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta

from gpuhealth.agent.model import ObservationSink, SourceName, XidObservation
from gpuhealth.common.clock import Clock
from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<dom>[0-9a-fA-F]{4,8}):"
    r"(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.(?P<fn>[0-7]))?\):\s*(?P<xid>\d{1,6})(?:,\s*(?P<rest>.*))?$"
)
_PID = re.compile(r"pid=(?P<pid>\d+|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*?)\s*(?:,\s*|$)")


@dataclass(frozen=True, slots=True)
class ParsedXid:
    xid: int
    pci_bus_id: str
    """NVML form: ``00000000:1B:00.0``."""
    pid: int | None
    process_name: str | None
    message: str


def kernel_pci_to_nvml(domain: str, bus: str, device: str, function: str | None = None) -> str:
    """``0000``, ``1b``, ``00`` -> ``00000000:1B:00.0`` (NVML's bus id form)."""
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function or '0'}"


def strip_prefix(line: str) -> str:
    """Drop a /dev/kmsg record header (``6,123,456,-;``) or a dmesg ``[  12.3]`` prefix."""
    semi = line.find(";")
    if 0 < semi < 64 and line[0].isdigit():
        head = line[:semi].split(",")
        if len(head) >= 3 and head[0].isdigit() and head[1].isdigit():
            return line[semi + 1 :]
    if line.startswith("["):
        close = line.find("]")
        if 0 < close < 32:
            return line[close + 1 :].lstrip()
    return line


def parse_line(line: str) -> ParsedXid | None:
    """Parse one kernel-log line; ``None`` when it is not a well-formed NVRM Xid line."""
    idx = line.find("NVRM: Xid")
    if idx < 0:
        return None
    m = _XID.match(line.rstrip("\r\n"), idx)
    if m is None:
        return None
    try:
        xid = int(m.group("xid"))
        pci = kernel_pci_to_nvml(m.group("dom"), m.group("bus"), m.group("dev"), m.group("fn"))
    except ValueError:
        return None
    rest = m.group("rest") or ""
    pid: int | None = None
    name: str | None = None
    pm = _PID.match(rest)
    if pm is not None:
        raw = pm.group("pid")
        pid = int(raw) if raw.isdigit() else None
        rest = rest[pm.end() :]
        nm = _NAME.match(rest)
        if nm is not None:
            name = nm.group("name") or None
            rest = rest[nm.end() :]
    return ParsedXid(xid=xid, pci_bus_id=pci, pid=pid, process_name=name, message=rest.strip())


class KmsgSettings(Settings, frozen=True, kw_only=True):
    file_poll_interval_s: PositiveSeconds = 0.01
    """How often a regular file is checked for new lines (tail -F)."""
    select_timeout_s: PositiveSeconds = 0.5
    """How long one wait on /dev/kmsg or a FIFO lasts before the reader checks for stop."""
    max_line_bytes: Annotated[int, Meta(ge=256, le=1 << 20)] = 8192
    """Longer lines are cut (a /dev/kmsg record is at most 8 KiB)."""
    queue_max: PositiveInt = 10_000
    """Lines waiting for the event loop; beyond this, lines are dropped and counted."""


class KmsgSource:
    """Follows the kernel log and reports XIDs (a :class:`agent.model.Source`)."""

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
        self.lines_total = 0
        """Kernel-log lines read."""
        self.malformed_total = 0
        """NVRM Xid lines that did not parse, plus XIDs whose PCI address did not map."""
        self.unmapped_total = 0
        """The part of ``malformed_total`` that parsed but named an unknown PCI address."""
        self.xids_total = 0
        self.overwritten_total = 0
        """/dev/kmsg records lost because the kernel ring buffer wrapped (EPIPE)."""
        self.dropped_total = 0
        self.up = False
        self.ready = threading.Event()
        """Set once the reader is positioned at the end and following."""

    def handle_line(self, line: str, sink: ObservationSink) -> None:
        """Count and parse one line; emit an XidObservation for a good one."""
        self.lines_total += 1
        if "NVRM: Xid" not in line:
            return
        try:
            parsed = parse_line(strip_prefix(line))
        except Exception:  # a parser bug must never stop the follower
            parsed = None
        if parsed is None:
            self.malformed_total += 1
            return
        uuid = self._pci_to_uuid(parsed.pci_bus_id)
        if uuid is None:
            self.unmapped_total += 1
            self.malformed_total += 1
        self.xids_total += 1
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
            )
        )

    async def run(self, sink: ObservationSink) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | BaseException] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: str | BaseException) -> None:
            if queue.qsize() >= self.settings.queue_max and isinstance(item, str):
                self.dropped_total += 1
                return
            queue.put_nowait(item)

        def push(item: str | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(deliver, item)

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
                    self.up = False
                    raise item
                self.up = True
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
            self.ready.set()
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
                            self.overwritten_total += 1
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
            self.ready.set()
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
                self.ready.set()
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
                self.ready.set()

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
