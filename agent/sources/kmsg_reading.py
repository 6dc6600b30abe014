"""What one run of the kernel-log follower does with each line it reads, on the event loop
(the reader threads are :mod:`gpuhealth.agent.sources.kmsg_readers`): a /dev/kmsg record an
earlier run of this boot handled is skipped; lines logged before start (the ring buffer's
replay, a file's lines from the saved position or its read-back window) are dated by their own
stamp, and in a file's read-back window only those inside it are handled; around each XID the
position is saved (pending before the sink, handled once the engine has taken the XID, which
may be later: an XID read before the first GPU inventory waits in the engine;
:mod:`gpuhealth.agent.sources.kmsg_position`), a file's offset after other lines at most every
``kmsg.file_position_save_s`` and never past an XID the engine has not taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.observations import ObservationSink, XidObservation
from gpuhealth.agent.sources.kmsg_parser import (
    line_wall_time,
    record_seq,
    record_time_us,
    record_wall_time,
)
from gpuhealth.agent.sources.kmsg_position import FileMark, KmsgPosition, PositionFile, line_crc
from gpuhealth.agent.sources.kmsg_readers import CaughtUp, FileLine
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

if TYPE_CHECKING:
    from gpuhealth.agent.sources.settings import KmsgSettings


KMSG_REPLAYED = CounterSpec(
    "kmsg_replayed_xids",
    "XIDs read from /dev/kmsg records logged before the agent started (the ring buffer's "
    "replay), not handled by an earlier run of this boot.",
)
KMSG_SKIPPED = CounterSpec(
    "kmsg_already_handled_records",
    "/dev/kmsg records of the replay that an earlier run of this boot had handled (skipped).",
)
KMSG_LOOKBACK_OLD = CounterSpec(
    "kmsg_lookback_old_lines",
    "Lines of a followed file's read-back window (first start of a boot) dated before the "
    "window or before this boot: not handled.",
)

log = get_logger("kmsg")


@dataclass(frozen=True, slots=True)
class ReadingContext:
    path: str
    settings: KmsgSettings
    clock: Clock
    counters: Counters
    position: KmsgPosition | None
    observe: Callable[[str, datetime | None, bool], XidObservation | None]
    """Count and parse a line (its time, whether it is a redelivery): its XID or None."""
    sink: ObservationSink


class Reading:
    """One run's lines on the event loop: what was handled before is skipped, lines from
    before start are dated by their own stamp (and, in a file's read-back window, kept only
    when inside it), the position is saved around each XID."""

    def __init__(
        self, ctx: ReadingContext, saved: PositionFile | None, *, backlog: bool, lookback: bool
    ) -> None:
        self._ctx = ctx
        self._clock = ctx.clock
        self._position = ctx.position
        self._handled = saved.seq if saved is not None else None
        self._pending = saved.pending if saved is not None else None
        self._backlog = backlog
        """Before CAUGHT_UP: lines logged before start (a FIFO has none)."""
        self._lookback = lookback
        self._mark: FileMark | None = None
        self._saved_mark_at = self._clock.monotonic()
        self._dirty = False
        self._untaken = 0
        """XIDs handed to the sink that the engine has not taken yet: the position stays
        before them."""

    def take(self, item: str | FileLine | CaughtUp, *, idle: bool) -> None:
        if isinstance(item, CaughtUp):
            self._backlog = False
            self._lookback = False
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
        if item.text and self._backlog:
            clock = self._clock
            at = line_wall_time(item.text, clock.now(), clock.monotonic())
            if self._lookback and at is not None and at < self._window_start():
                self._ctx.counters.inc(KMSG_LOOKBACK_OLD)
                at = None
                item = FileLine("", item.dev, item.ino, item.end)
        # The offset moves past the line only once it was handled: a sink that raised leaves
        # it to be read again (and an XID the engine holds keeps it there until taken).
        if item.text:
            self._hand_on(item.text, at, item.end, file=True)
        self._mark = FileMark(path=self._ctx.path, dev=item.dev, ino=item.ino, offset=item.end)
        self._dirty = True

    def _window_start(self) -> datetime:
        now = self._clock.now()
        booted = now - timedelta(seconds=self._clock.monotonic())
        return max(now - timedelta(seconds=self._ctx.settings.file_lookback_s), booted)

    def _hand_on(
        self, line: str, at: datetime | None, where: int | None, *, file: bool = False
    ) -> bool:
        """Parse, write the pending mark, hand to the sink; True for an XID. The position
        moves past it when the engine has taken it (:meth:`_taken`)."""
        pending = self._pending
        redelivered = (
            pending is not None
            and where is not None
            and pending.at == where
            and pending.crc == line_crc(line)
        )
        if redelivered:
            self._pending = None
        obs = self._ctx.observe(line, at, redelivered)
        if obs is None:
            return False
        if self._backlog and not redelivered:
            self._ctx.counters.inc(KMSG_REPLAYED)
        if self._position is not None and where is not None:
            self._position.handling(where, line)
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
            self._position.save(where)  # records are taken in order; only forward
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
        self._position.save_file(self._mark)
        self._saved_mark_at = now
        self._dirty = False

    def flush(self) -> None:
        self._save_mark(force=True)
