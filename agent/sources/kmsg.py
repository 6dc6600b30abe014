"""Kernel-log follower: ``NVRM: Xid`` lines from /dev/kmsg, a log file or a FIFO.

Blocking reads happen in a dedicated thread (:mod:`gpuhealth.agent.sources.kmsg_readers`);
lines reach the event loop through a bounded
queue (a full queue drops and counts lines). Each line is parsed
(:mod:`gpuhealth.agent.sources.kmsg_parser`) and an
:class:`~gpuhealth.agent.observations.XidObservation` carrying its PCI address handed to the
sink (the health engine maps the address to its GPU). Garbage is counted, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    ObservationSink,
    PciAddress,
    SourceName,
    XidObservation,
)
from gpuhealth.agent.sources.kmsg_parser import parse_line, strip_prefix
from gpuhealth.agent.sources.kmsg_position import FileStart, KmsgPosition, start_plan
from gpuhealth.agent.sources.kmsg_readers import (
    FileLine,
    Item,
    Push,
    ReaderContext,
    follow_fifo,
    follow_file,
    follow_kmsg,
    open_kmsg,
    open_kmsg_at_end,
)
from gpuhealth.agent.sources.kmsg_reading import (
    KMSG_LOOKBACK_OLD,
    KMSG_REPLAYED,
    KMSG_SKIPPED,
    Reading,
    ReadingContext,
)
from gpuhealth.agent.sources.settings import KmsgSettings
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")


KMSG_LINES = CounterSpec("kmsg_lines", "Kernel-log lines read.")
KMSG_MALFORMED = CounterSpec(
    "kmsg_malformed_lines", "NVRM Xid lines that did not parse (or carry no PCI address)."
)
KMSG_XIDS = CounterSpec("kmsg_xids", "XIDs read from the kernel log.")
KMSG_DROPPED = CounterSpec(
    "kmsg_dropped_lines",
    "Kernel-log lines dropped because the agent fell behind (queue_max lines waiting): "
    "XIDs may have been lost.",
)
KMSG_REDELIVERED = CounterSpec(
    "kmsg_redelivered_xids",
    "XID lines read again after a restart because the run that handed them on stopped before "
    "saving its position: the engine drops those whose verdict it already holds.",
)
KMSG_OVERRUNS = CounterSpec(
    "kmsg_overruns",
    "Times the kernel ring buffer wrapped before /dev/kmsg was read (EPIPE): records, "
    "possibly XIDs, were lost.",
)


class KmsgSource:
    """Follows the kernel log and reports XIDs (a :class:`~gpuhealth.agent.sources.base.Source`).

    Up while it follows the log (a quiet log is not a failure); ready once it follows, so
    that every line written from then on is seen. /dev/kmsg is read from the oldest record of
    its ring buffer (XIDs logged while the agent was down), skipping records an earlier run of
    this boot handled; a regular file resumes at the offset an earlier run of this boot saved,
    or reads back ``file_lookback_*`` at the first start
    (:mod:`~gpuhealth.agent.sources.kmsg_position`). A FIFO keeps no position: what is in its
    pipe buffer when the follower opens it is read, and at stop the lines already read are
    handled before the source ends.
    """

    name: SourceName = "kmsg"

    def __init__(
        self,
        path: str,
        settings: KmsgSettings,
        clock: Clock,
        *,
        position: KmsgPosition | None = None,
        open_device: Callable[[str], int] | None = None,
    ) -> None:
        """``position``: where an earlier run of this boot got to (None: replay /dev/kmsg,
        read a file's look-back window, remember nothing). ``open_device``: treat ``path`` as
        /dev/kmsg and open it with this (tests); by default the path's file type decides."""
        self.path = path
        self.settings = settings
        self._clock = clock
        self.counters = Counters(
            KMSG_LINES,
            KMSG_MALFORMED,
            KMSG_XIDS,
            KMSG_DROPPED,
            KMSG_OVERRUNS,
            KMSG_REPLAYED,
            KMSG_SKIPPED,
            KMSG_LOOKBACK_OLD,
            KMSG_REDELIVERED,
        )
        self._position = position
        self._open_device = open_device
        self.errors = 0
        self.polls: Histogram | None = None
        self._attached = threading.Event()
        """Set by the reader thread once it is positioned and following."""
        self._failed = False

    @property
    def ready(self) -> bool:
        return self._attached.is_set()

    @property
    def up(self) -> bool:
        return self._attached.is_set() and not self._failed

    def observation(
        self, line: str, at: datetime | None = None, redelivered: bool = False
    ) -> XidObservation | None:
        """Count and parse one line: the XidObservation of a good XID line, else None.
        ``at``: when it was logged (a replayed line's own time); None: now."""
        self.counters.inc(KMSG_LINES)
        if "NVRM: Xid" not in line:
            return None
        try:
            parsed = parse_line(strip_prefix(line))
        except Exception:  # a parser bug must never stop the follower
            parsed = None
        pci = PciAddress.parse(parsed.pci_bus_id) if parsed is not None else None
        if parsed is None or pci is None:
            self.counters.inc(KMSG_MALFORMED)
            return None
        self.counters.inc(KMSG_REDELIVERED if redelivered else KMSG_XIDS)
        return XidObservation(
            source="kmsg",
            xid=parsed.xid,
            at=at or self._clock.now(),
            pci=pci,
            pid=parsed.pid,
            process_name=parsed.process_name,
            message=parsed.message[:512],
            gpu_instance=parsed.gpu_instance,
            compute_instance=parsed.compute_instance,
            redelivered=redelivered,
        )

    def handle_line(self, line: str, sink: ObservationSink, *, at: datetime | None = None) -> bool:
        """:meth:`observation`, handed to ``sink`` (then True)."""
        obs = self.observation(line, at=at)
        if obs is None:
            return False
        sink(obs)
        return True

    async def run(self, sink: ObservationSink) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: Item) -> None:
            if queue.qsize() >= self.settings.queue_max and isinstance(item, str | FileLine):
                self.counters.inc(KMSG_DROPPED)
                return
            queue.put_nowait(item)

        def push(item: Item) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(deliver, item)

        self._attached.clear()
        self._failed = False
        kind = self._kind()
        saved = self._position.load() if self._position is not None else None
        start = (
            start_plan(self.path, saved.file if saved else None, self.settings.file_lookback_bytes)
            if kind == "file"
            else None
        )
        reading = Reading(
            ReadingContext(
                path=self.path,
                settings=self.settings,
                clock=self._clock,
                counters=self.counters,
                position=self._position,
                observe=self.observation,
                sink=sink,
            ),
            saved,
            backlog=kind != "fifo",
            lookback=start is not None and start.lookback,
        )
        reader = threading.Thread(
            target=self._reader,
            args=(kind, push, stop, start),
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
                reading.take(item, idle=queue.empty())
        finally:
            stop.set()
            # What the reader thread has read is handled before the source ends: a FIFO's
            # lines are gone from the pipe once read.
            await asyncio.to_thread(reader.join, 2 * self.settings.select_timeout_s + 1.0)
            await asyncio.sleep(0)
            while not queue.empty():
                item = queue.get_nowait()
                if not isinstance(item, BaseException):
                    reading.take(item, idle=False)
            reading.flush()

    # ----------------------------------------------------------------- reader thread

    def _kind(self) -> Literal["kmsg", "fifo", "file"]:
        if self._open_device is not None:
            return "kmsg"
        try:
            mode = os.stat(self.path).st_mode
        except OSError:
            return "file"  # the reader reports a missing path (or follows a file to come)
        if stat.S_ISCHR(mode):
            return "kmsg"
        return "fifo" if stat.S_ISFIFO(mode) else "file"

    def _reader(
        self,
        kind: Literal["kmsg", "fifo", "file"],
        push: Push,
        stop: threading.Event,
        start: FileStart | None,
    ) -> None:
        s = self.settings
        ctx = ReaderContext(
            path=self.path,
            max_line_bytes=s.max_line_bytes,
            select_timeout_s=s.select_timeout_s,
            file_poll_interval_s=s.file_poll_interval_s,
            file_poll_max_s=s.file_poll_max_s,
            use_inotify=s.use_inotify,
            attached=self._attached,
            counters=self.counters,
            overruns=KMSG_OVERRUNS,
            open_device=self._open_device or (open_kmsg if s.replay else open_kmsg_at_end),
        )
        try:
            if self._open_device is None:
                os.stat(self.path)  # a path missing at start fails the source
            if kind == "kmsg":
                follow_kmsg(ctx, push, stop)
            elif kind == "fifo":
                follow_fifo(ctx, push, stop)
            else:
                follow_file(ctx, push, stop, start)
        except Exception as exc:  # reported to the supervisor through run()
            err = TransientError(f"kernel log {self.path}: {exc}")
            err.__cause__ = exc
            push(err)
