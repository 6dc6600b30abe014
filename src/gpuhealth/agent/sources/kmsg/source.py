"""Kernel-log follower: ``NVRM: Xid`` lines from /dev/kmsg, a log file or a FIFO, what one run
does with each line, and where the follower got to.

Blocking reads happen in dedicated threads (:mod:`gpuhealth.agent.sources.kmsg.readers`);
lines reach the event loop through a bounded queue (a full queue drops and counts lines).
Each line is parsed (:mod:`gpuhealth.agent.sources.kmsg.parser`) and an
:class:`~gpuhealth.agent.observations.XidObservation` carrying its PCI address handed to the
sink (the health engine maps the address to its GPU). Garbage is counted, never raised.

**Each line** (:class:`Reading`, on the event loop): a /dev/kmsg record an earlier run of this
boot handled is skipped; lines logged before start (the ring buffer's replay, a file's lines
from the saved position or its read-back window) are dated by their own stamp, and a file's
lines dated before the start plan's ``history_before`` (outside a first start's window, or
more than ``file_lookback_s`` before the position was saved) are skipped, counted and
logged once with their number, unless an earlier run handed the line on unconfirmed.

**The position** (:class:`KmsgPosition`, the ``kmsg_position`` document of the agent's state
store, per boot): the last handled /dev/kmsg sequence number, or a followed file's identity
(device, inode, birth time, content fingerprint) and offset. /dev/kmsg numbers its records
(``prio,SEQ,usec,flags;message``) from 0 at boot; the follower reads the ring buffer from its
oldest record at start, so XIDs logged while the agent was down or restarting are seen, and
records up to the saved sequence number of the same boot are skipped. A position of an earlier
boot (or none) means: replay every record of this boot. A followed file resumes at the saved
offset only when it is still the saved file; any other file at the path is read from its
start (its head and its end where it is large), after the rest of the saved file where it
still lies beside it; with no position of this boot the follower reads back a bounded window
(:mod:`gpuhealth.agent.sources.kmsg.file_start`). A file's position keeps when it was saved
(``FileMark.saved_at``), what dates a later start's history: the time of the save once the
follower caught up with the file, and while it still reads the lines there were at start,
the time its own start dated history from (``FileStart.dated_from``), so that a crash then
makes none of the lines it had not read yet history.

Around each XID the position is saved: the line handed to the sink is written down first
(``handed``: its sequence number or end offset, with a CRC of its text and a file's inode and
head hash, next to every earlier line handed on that the position does not cover yet; a file's
offset moves to the line's start in the same write when no XID waits in the engine, with the
mark after the line, ``reached``: what the file held past the position, which a later start
checks too, since at offset 0 a fingerprint tells nothing), and the position moves past it
only once the engine has taken the XID (``XidObservation.on_taken``; an XID read before the
first GPU inventory waits in the engine, and the position stays before it). The engine driver's
transaction commits that with the XID's outbox Event and latched verdict. A run that finds
handed lines of its own boot reads each again as a *redelivery*: the engine drops it when the
verdict it would raise is already latched, so a crash at any point handles every line at least
once and counts it once. A file's offset follows other lines at most every
``kmsg.file_position_save_s`` and never passes an XID the engine has not taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Literal

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    ObservationSink,
    PciAddress,
    SourceName,
    SxidObservation,
    XidObservation,
)
from gpuhealth.agent.sources.kmsg.file_start import (
    MISMATCHES,
    FileMark,
    FileStart,
    StartBounds,
    plan_file,
)
from gpuhealth.agent.sources.kmsg.parser import (
    line_wall_time,
    parse_line,
    record_seq,
    record_time_us,
    record_wall_time,
    strip_prefix,
)
from gpuhealth.agent.sources.kmsg.readers import (
    CaughtUp,
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
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.sxid import parse_sxid
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")


KMSG_LINES = CounterSpec("kmsg_lines", "Kernel-log lines read.")
KMSG_MALFORMED = CounterSpec(
    "kmsg_malformed_lines", "NVRM Xid lines that did not parse (or carry no PCI address)."
)
KMSG_XIDS = CounterSpec("kmsg_xids", "XIDs read from the kernel log.")
KMSG_SXIDS = CounterSpec(
    "kmsg_sxids", "NVSwitch errors (SXid headlines, fatal or not) read from the kernel log."
)
KMSG_MALFORMED_SXIDS = CounterSpec(
    "kmsg_malformed_sxid_lines", "NVSwitch SXid lines that did not parse."
)
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
    this boot handled; a regular file resumes at the offset an earlier run of this boot saved
    when it is still that file, is read from its start when it is another one, or reads back
    ``file_lookback_*`` at the first start (:mod:`gpuhealth.agent.sources.kmsg.file_start`).
    A FIFO keeps no position: what is in its
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
            KMSG_FILE_MISMATCHES,
            KMSG_FILE_SKIPPED_BYTES,
            KMSG_REDELIVERED,
            KMSG_SXIDS,
            KMSG_MALFORMED_SXIDS,
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
    ) -> XidObservation | SxidObservation | None:
        """Count and parse one line: the XidObservation of a good XID line, the
        SxidObservation of an NVSwitch error's headline, else None. ``at``: when it was
        logged (a replayed line's own time); None: now."""
        self.counters.inc(KMSG_LINES)
        if "NVRM: Xid" not in line:
            return self._sxid(line, at, redelivered) if "SXid" in line else None
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

    def _sxid(self, line: str, at: datetime | None, redelivered: bool) -> SxidObservation | None:
        try:
            parsed = parse_sxid(strip_prefix(line))
        except Exception:  # a parser bug must never stop the follower
            parsed = None
        if parsed is None:
            self.counters.inc(KMSG_MALFORMED_SXIDS)
            return None
        if parsed.detail:
            return None
        self.counters.inc(KMSG_SXIDS)
        return SxidObservation(
            source="kmsg",
            sxid=parsed.sxid,
            at=at or self._clock.now(),
            fatal=parsed.fatal,
            switch=parsed.switch,
            pci=PciAddress.parse(parsed.pci_bus_id),
            link=parsed.link,
            message=parsed.message[:512],
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
        start: FileStart | None = None
        if kind == "file":
            mark = saved.file if saved else None
            clock = self._clock
            bounds = StartBounds.of(self.settings, clock.now(), clock.monotonic())
            reached = saved.reached if saved else None
            start = await asyncio.to_thread(plan_file, self.path, mark, bounds, reached)
            self._started(start, mark, reached)
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
            start=start,
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

    def _started(
        self, start: FileStart | None, saved: FileMark | None, reached: FileMark | None
    ) -> None:
        """Say where a followed file starts, and why (``reached``: the end of the line handed
        on past the saved offset that the file had to hold too); count a file that is not
        the saved one though it has the saved inode."""
        if start is None:
            return
        if start.reason in MISMATCHES:
            self.counters.inc(KMSG_FILE_MISMATCHES, label=start.reason)
        say = (
            log.warning if start.reason in MISMATCHES or start.reason == "unverified" else log.info
        )
        say(
            "kmsg_file_start",
            path=self.path,
            reason=start.reason,
            offset=start.offset,
            saved_offset=saved.offset if saved is not None else None,
            reached_offset=reached.offset if reached is not None else None,
            rest_of=start.rotated.path if start.rotated is not None else None,
            history_before=start.history_before.isoformat() if start.history_before else None,
        )
        if start.gap is not None:
            head_end, tail = start.gap
            self.counters.inc(KMSG_FILE_SKIPPED_BYTES, tail - head_end)
            log.warning(
                "kmsg_file_gap",
                path=self.path,
                reason=start.reason,
                head_end=head_end,
                tail_start=tail,
                skipped_bytes=tail - head_end,
            )

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
            fingerprint_bytes=s.file_fingerprint_bytes,
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


KMSG_REPLAYED = CounterSpec(
    "kmsg_replayed_xids",
    "XIDs read from /dev/kmsg records logged before the agent started (the ring buffer's "
    "replay), not handled by an earlier run of this boot.",
)
KMSG_SKIPPED = CounterSpec(
    "kmsg_already_handled_records",
    "/dev/kmsg records of the replay that an earlier run of this boot had handled (skipped).",
)
KMSG_FILE_MISMATCHES = CounterSpec(
    "kmsg_file_mismatches",
    "Starts at which the followed file had the saved inode but was another file (removed and "
    "created anew, truncated, other content), so it was read from its start instead of "
    "resumed at the saved offset.",
    label="reason",
)
KMSG_LOOKBACK_OLD = CounterSpec(
    "kmsg_lookback_old_lines",
    "Lines of a followed file read at start dated before its window or before this boot: "
    "not handled. The first start's read-back window (kmsg.file_lookback_s before now); a "
    "file that is not the saved one, its history (dated more than kmsg.file_lookback_s "
    "before the position was saved).",
)
KMSG_FILE_SKIPPED_BYTES = CounterSpec(
    "kmsg_file_skipped_bytes",
    "Bytes of a followed file that were not read at start: the middle of a file that is not "
    "the saved one and is larger than kmsg.file_new_head_bytes + kmsg.file_lookback_bytes "
    "(its head and its end are read). Lines, possibly XIDs, there were not handled.",
)


@dataclass(frozen=True, slots=True)
class ReadingContext:
    path: str
    settings: KmsgSettings
    clock: Clock
    counters: Counters
    position: KmsgPosition | None
    observe: Callable[[str, datetime | None, bool], XidObservation | SxidObservation | None]
    """Count and parse a line (its time, whether it is a redelivery): its XID or None."""
    sink: ObservationSink


class Reading:
    """One run's lines on the event loop: what was handled before is skipped, lines from
    before start are dated by their own stamp (and, in a file's read-back window, kept only
    when inside it), the position is saved around each XID."""

    def __init__(
        self,
        ctx: ReadingContext,
        saved: PositionFile | None,
        *,
        backlog: bool,
        start: FileStart | None = None,
    ) -> None:
        """``start``: a followed file's start plan (None: /dev/kmsg, a FIFO)."""
        self._ctx = ctx
        self._clock = ctx.clock
        self._position = ctx.position
        self._handled = saved.seq if saved is not None else None
        self._handed = set(saved.handed) if saved is not None else set()
        """Lines an earlier run handed on past its saved position: each comes back once as a
        redelivery."""
        self._backlog = backlog
        """Before CAUGHT_UP: lines logged before start (a FIFO has none)."""
        self._start = start
        self._history_before = start.history_before if start is not None else None
        """Before CAUGHT_UP, a followed file's lines dated before this are skipped."""
        self._dated_from = start.dated_from if start is not None else None
        """Before CAUGHT_UP, the time a followed file's saved marks carry (``_stamped``)."""
        self._history = 0
        """Lines skipped so far as dated before ``_history_before`` (logged once)."""
        self._redeliver = start is not None and start.redeliver
        """Lines before CAUGHT_UP are redeliveries (a position that could not be verified)."""
        self._mark: FileMark | None = None
        self._ahead = Ahead()
        """What lies ahead of ``_mark`` besides its file's lines past it."""
        rest = start.rotated if start is not None else None
        self._rest = (rest.dev, rest.ino) if rest is not None else None
        """The rest of the saved file (device, inode), read first: until a line of another
        file comes (the file at the path's)."""
        self._saved_mark_at = self._clock.monotonic()
        self._dirty = False
        self._untaken = 0
        """XIDs handed to the sink that the engine has not taken yet: the position stays
        before them."""
        self._taken_seq: int | None = None
        """The highest /dev/kmsg record taken: saved once nothing handed on waits."""

    def take(self, item: str | FileLine | CaughtUp, *, idle: bool) -> None:
        if isinstance(item, CaughtUp):
            self._caught_up()
        elif isinstance(item, FileLine):
            self._file_line(item)
            if idle:
                self._save_mark(force=False)
        else:
            self._record(item)

    def _record(self, line: str) -> None:
        """A /dev/kmsg record or a FIFO's line."""
        seq = record_seq(line)
        if seq is not None and self._handled is not None and seq <= self._handled:
            self._ctx.counters.inc(KMSG_SKIPPED)
            return
        at = self._record_time(line) if self._backlog else None
        self._hand_on(line, at, seq)

    def _file_line(self, item: FileLine) -> None:
        at: datetime | None = None
        handed = (item.handed_ino, item.ino, item.fingerprint.head if item.fingerprint else 0)
        if item.text and self._backlog:
            clock = self._clock
            at = line_wall_time(item.text, clock.now(), clock.monotonic())
            since = self._history_before
            if since is not None and at is not None and at < since and not self._pending(item):
                self._ctx.counters.inc(KMSG_LOOKBACK_OLD)
                self._history += 1
                at = None
                item = replace(item, text="")
        # The offset moves past the line once it was handled (an XID the engine holds keeps
        # it before the line until taken): a sink that raised leaves it to be read again.
        if self._rest is not None and (item.dev, item.ino) != self._rest:
            self._rest = None
        prev, prev_ahead = self._mark, self._ahead
        self._ahead = Ahead(copy_of=item.handed_ino, rest=self._rest is not None)
        self._mark = FileMark(
            path=self._ctx.path,
            dev=item.dev,
            ino=item.ino,
            offset=item.end,
            born=item.born,
            fingerprint=item.fingerprint,
        )
        self._dirty = True
        if item.text:
            try:
                self._hand_on(
                    item.text,
                    at,
                    item.end,
                    file=True,
                    ino=item.ino,
                    start=prev,
                    start_ahead=prev_ahead,
                    handed=handed,
                )
            except BaseException:
                self._mark, self._ahead = prev, prev_ahead
                raise

    def _pending(self, item: FileLine) -> bool:
        """An earlier run handed the line on and never confirmed it: no history, however old
        (it comes back as a redelivery)."""
        head = item.fingerprint.head if item.fingerprint else 0
        return (
            self._handed_before(item.end, item.text, (item.handed_ino, item.ino, head)) is not None
        )

    def _handed_before(self, at: int, text: str, handed: tuple[int, int, int]) -> Pending | None:
        """How an earlier run wrote down the line at ``at`` as handed on, if it did: under
        ``handed``'s first inode (the one the saved position names: a copy's lines were read
        from the saved file) or its second (the file's own: a run that read the copy wrote
        them down under it), with its head hash."""
        if not self._handed:
            return None
        crc = line_crc(text)
        ino_was, ino, head = handed
        for candidate in dict.fromkeys((ino_was, ino)):
            this = Pending(at=at, crc=crc, ino=candidate, head=head)
            if this in self._handed:
                return this
        return None

    def _caught_up(self) -> None:
        """The lines there were at start are read: say once how many were history; the
        position is saved again (dated now) at the next save."""
        self._backlog = False
        self._redeliver = False
        self._dirty = self._dirty or self._mark is not None
        if self._history and self._start is not None and self._history_before is not None:
            log.info(
                "kmsg_file_history_skipped",
                path=self._ctx.path,
                reason=self._start.reason,
                lines=self._history,
                dated_before=self._history_before.isoformat(),
            )
        self._history_before = None

    def _hand_on(
        self,
        line: str,
        at: datetime | None,
        where: int | None,
        *,
        file: bool = False,
        ino: int = 0,
        start: FileMark | None = None,
        start_ahead: Ahead | None = None,
        handed: tuple[int, int, int] = (0, 0, 0),
    ) -> bool:
        """Parse, write the line down as handed on, hand it to the sink; True for an XID. The
        position moves past it when the engine has taken it (:meth:`_taken`). A file's line:
        ``ino`` its inode, ``start`` where it starts (the mark after the line before, and
        what lies ahead of it: ``start_ahead``), ``handed`` the inodes and head hash an
        earlier run would have written it down with (:meth:`_handed_before`)."""
        redelivered = self._redeliver
        if where is not None:
            before = self._handed_before(where, line, handed)
            if before is not None:
                redelivered = True
                self._handed.discard(before)
        obs = self._ctx.observe(line, at, redelivered)
        if obs is None:
            return False
        if self._backlog and not redelivered:
            self._ctx.counters.inc(KMSG_REPLAYED)
        if self._position is not None and where is not None:
            # Every line before this one is handled when no XID waits in the engine: the
            # file's position moves to this line's start in the same write, so a crash now
            # reads no earlier XID again.
            # With it, the mark after this line (the same file): what the file held past the
            # position, which tells the saved file from another one at the next start.
            upto = None
            if file and start is not None and self._untaken == 0:
                upto = self._stamped(start)
            reached = self._mark if upto is not None else None
            self._position.handling(
                where, line, upto, ino, handed[2], reached=reached, ahead=start_ahead
            )
        if isinstance(obs, SxidObservation):
            log.info(
                "kernel_log_sxid",
                pci=str(obs.pci) if obs.pci is not None else None,
                sxid=obs.sxid,
                fatal=obs.fatal,
                switch=obs.switch,
                at=obs.at.isoformat(),
                position=where,
                replayed=self._backlog,
                redelivered=redelivered,
            )
            # A switch's error is handled once the sink returned (no GPU to map, no hold).
            self._untaken += 1
            try:
                self._ctx.sink(obs)
            except BaseException:
                self._untaken -= 1
                raise
            self._taken(where, file=file)
            return True
        log.info(
            "kernel_log_xid",
            xid=obs.xid,
            pci=str(obs.pci),
            pid=obs.pid,
            at=obs.at.isoformat(),
            position=where,
            replayed=self._backlog,
            redelivered=redelivered,
        )
        done = False

        def on_taken() -> None:
            nonlocal done
            if not done:
                done = True
                self._taken(where, file=file)

        self._untaken += 1
        try:
            self._ctx.sink(replace(obs, on_taken=on_taken))
        except BaseException:
            if not done:  # not taken: read again by the next run
                done = True
                self._untaken -= 1
            raise
        return True

    def _taken(self, where: int | None, *, file: bool) -> None:
        """The engine took the XID read at ``where``: the position may move past it."""
        self._untaken -= 1
        if self._position is None or where is None:
            return
        if not file:
            # An SXid is taken when the sink returns, while earlier XIDs may wait in the
            # engine: the position moves past a record only once every one before it is taken.
            self._taken_seq = max(where, self._taken_seq or where)
            if self._untaken == 0:
                self._position.save(self._taken_seq)  # only forward
        elif self._untaken == 0:
            self._save_mark(force=True)

    def _record_time(self, record: str) -> datetime | None:
        """A replayed /dev/kmsg record's own time on the wall clock (its stamp is the kernel's
        monotonic clock); a live record is stamped when read, which is then as exact."""
        time_us = record_time_us(record)
        if time_us is None:
            return None
        return record_wall_time(time_us, self._clock.now(), self._clock.monotonic())

    def _save_mark(self, *, force: bool) -> None:
        if self._position is None or self._mark is None or not self._dirty or self._untaken:
            return
        now = self._clock.monotonic()
        if not force and now - self._saved_mark_at < self._ctx.settings.file_position_save_s:
            return
        self._position.save_file(self._stamped(self._mark), ahead=self._ahead)
        self._saved_mark_at = now
        self._dirty = False

    def _stamped(self, mark: FileMark) -> FileMark:
        """``mark`` as saved now: when a later run meets another file at the path, or resumes
        this one, lines dated well before its time are history
        (``StartBounds.history_before``). Its time is now once the follower caught up (what
        follows was written since); before, the start's ``dated_from``: the lines after it,
        not read yet, are as old as this run let through, and a crash must not make them
        history."""
        at = self._dated_from if self._backlog else self._clock.now()
        return msgspec.structs.replace(mark, saved_at=at)

    def flush(self) -> None:
        self._save_mark(force=True)


NAME = "kmsg_position"


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """The line handed to the sink whose handling is not confirmed yet."""

    at: int
    """/dev/kmsg: its sequence number; a file: the offset after it."""
    crc: int
    """CRC-32 of the line's text: the same position with other text is another line."""
    ino: int = 0
    """A followed file's inode (offsets of two inodes are not comparable); 0 for records."""
    head: int = 0
    """A followed file's head hash at the line (its fingerprint's ``head``): a file that got
    the same inode number later, or was truncated and written again, is another file; 0 for
    records."""


HANDED_MAX = 2048
"""The most lines handed on and not yet passed by the saved position that are written down
(above the engine's ``health.unmapped_xid_hold_max``, the most it holds unconfirmed); beyond
it the oldest is forgotten, and a crash would count it a second time."""


class PositionFile(msgspec.Struct, kw_only=True):
    seq: int | None = None
    file: FileMark | None = None
    handed: tuple[Pending, ...] = ()
    """Lines handed to the sink past ``seq``/``file``, in order, whose handling the saved
    position does not cover yet."""
    reached: FileMark | None = None
    """A followed file: the mark after the first line handed on past ``file`` (written with
    it): what the saved file held past its offset, so that a later start tells it (or its
    copy) from a file truncated and grown back or created anew, also at offset 0
    (:mod:`gpuhealth.agent.sources.kmsg.file_start`). None once the position moved on."""


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

    def handling(
        self,
        at: int,
        text: str,
        upto: FileMark | None = None,
        ino: int = 0,
        head: int = 0,
        *,
        reached: FileMark | None = None,
        ahead: Ahead | None = None,
    ) -> None:
        """Before the sink: the line at ``at`` (sequence number, or end offset in inode
        ``ino`` whose head hash is ``head``) is handed over; ``upto``: a followed file is
        handled up to there (the line's start, possibly the end of the file rotated away), in
        the same write, with ``reached``, the mark after the line, and ``ahead``, what lies
        ahead of it besides its file's lines past it."""
        state = self._state
        if upto is not None:
            moved = msgspec.structs.replace(state, file=upto, reached=reached)
            state = _past(moved, upto.offset, upto.ino, ahead)
        handed = (*state.handed, Pending(at=at, crc=line_crc(text), ino=ino, head=head))
        self._write(msgspec.structs.replace(state, handed=handed[-HANDED_MAX:]))

    def save(self, seq: int) -> None:
        """Record /dev/kmsg record ``seq`` as handled (only forward)."""
        if self._state.seq is not None and seq <= self._state.seq:
            return
        self._write(_past(msgspec.structs.replace(self._state, seq=seq), seq))

    def save_file(self, mark: FileMark, *, ahead: Ahead | None = None) -> None:
        """Record a followed file as handled up to ``mark.offset`` (every line handed on
        before it was confirmed: nothing reached past it is kept); ``ahead``: what lies ahead
        of it besides its file's lines past it."""
        if mark == self._state.file and not self._state.handed:
            return
        moved = msgspec.structs.replace(self._state, file=mark, reached=None)
        self._write(_past(moved, mark.offset, mark.ino, ahead))

    def _write(self, content: PositionFile) -> None:
        """An I/O error is logged, not raised: the worst case is that a restart reads those
        lines again."""
        if content == self._state:
            return
        if self._store.put_boot_value(NAME, self._boot_id, msgspec.json.encode(content)):
            self._state = content


@dataclass(frozen=True, slots=True)
class Ahead:
    """What lies ahead of a followed file's mark besides its file's lines past it: the lines
    written down as handed on there stay written down when the position moves to the mark
    (:func:`_past`)."""

    copy_of: int = 0
    """The inode whose copy the mark is in (the rest of the saved file's ``copytruncate``
    copy, ``FileLine.handed_ino``; 0 or the mark's own: none): its lines past the mark lie in
    the copy at the same offsets."""
    rest: bool = False
    """The mark is in the rest of the saved file, read before the file at the path: the
    lines of every other inode (the file at the path's) lie ahead."""


def _past(state: PositionFile, at: int, ino: int = 0, ahead: Ahead | None = None) -> PositionFile:
    """``state`` without the handed lines the position ``at`` (in inode ``ino``; 0: records)
    covers: those before it, and those of another inode, which the follower left behind (a
    later XID may still be handed on while an earlier one is confirmed), unless they lie
    ``ahead``: a copied file's past ``at`` are the copy's, kept under its inode (where the
    next start, resuming in the copy, looks for them); in the saved file's rest, every other
    inode's."""
    copy_of, rest = (ahead.copy_of, ahead.rest) if ahead is not None else (0, False)
    kept: list[Pending] = []
    for p in state.handed:
        if p.ino == ino:
            if p.at > at:
                kept.append(p)
            continue
        if p.ino == copy_of and p.at > at:
            kept.append(msgspec.structs.replace(p, ino=ino))
        if rest:
            kept.append(p)
    return msgspec.structs.replace(state, handed=tuple(dict.fromkeys(kept)))
