"""Where a followed file starts after a restart (the pure plan over in-memory files), its
fingerprint as the reader keeps it, and a state machine of appends, truncations,
copytruncates, rotations, recreations (with and without the inode number reused, with and
without birth times), old logs restored into place, time passing (also longer than
``file_lookback_s``) and restarts in which no line is ever skipped or delivered twice, and no
line of restored history is delivered again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpuhealth.agent.sources.kmsg.file_start import (
    EMPTY,
    FileMark,
    FileStart,
    FileView,
    LinePrints,
    RotatedRest,
    StartBounds,
    StartReason,
    holds_content,
    start_plan,
)
from tests.support.kmsg_files import prints_of

PATH = "/var/log/kern.log"
COPY = "/var/log/kern.log.1"
DEV = 7
LIMIT = 16
"""A small ``file_fingerprint_bytes``: heads and long lines are cut."""
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
BOOTED = NOW - timedelta(days=1)
LOOKBACK_S = 300.0
"""``file_lookback_s``."""
WIDE = 1 << 20
"""Byte bounds that no file here reaches."""


@dataclass
class MemFile:
    """A file in memory (an inode): a :class:`FileView` that counts what it reads."""

    path: str
    ino: int
    born: int | None
    data: bytearray = field(default_factory=bytearray)
    dev: int = DEV
    read_bytes: int = 0
    truncations: int = 0
    """(The state machine's) how often it was truncated: what it holds since is another
    content than a position saved before describes."""

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        self.read_bytes += length
        return bytes(self.data[offset : offset + length])


def mark(f: MemFile, offset: int, limit: int = LIMIT, saved_at: datetime | None = None) -> FileMark:
    """The position a run saves after the line of ``f`` ending at ``offset``."""
    fp = EMPTY if offset == 0 else prints_of(bytes(f.data[:offset]), limit)[offset]
    return FileMark(
        path=PATH, dev=f.dev, ino=f.ino, offset=offset, born=f.born, fingerprint=fp,
        saved_at=saved_at,
    )  # fmt: skip


def bounds(lookback: int = WIDE, head: int = WIDE, now: datetime = NOW) -> StartBounds:
    return StartBounds(
        lookback_bytes=lookback, lookback_s=LOOKBACK_S, new_head_bytes=head, now=now,
        booted=BOOTED,
    )  # fmt: skip


def plan(
    saved: FileMark | None,
    current: MemFile | None,
    *siblings: MemFile,
    lookback: int = WIDE,
    head: int = WIDE,
    now: datetime = NOW,
    reached: FileMark | None = None,
) -> FileStart | None:
    def others() -> Iterable[FileView]:
        return siblings

    return start_plan(PATH, saved, current, others, bounds(lookback, head, now), reached=reached)


def ago(seconds: float, now: datetime = NOW) -> datetime:
    return now - timedelta(seconds=seconds)


def lines(*ids: int) -> bytes:
    """Equal-length lines, one per id, which they start and end with (as kern.log's start
    with their time and end with what the driver says)."""
    return b"".join(b"%06d NVRM: Xid 79 pid=%06d\n" % (i, i) for i in ids)


OLD = lines(1, 2, 3)


def test_the_saved_file_resumes_at_its_offset() -> None:
    f = MemFile(PATH, 10, 111, bytearray(OLD))
    saved = mark(f, len(OLD))
    f.data += lines(4)  # grew while the agent was down
    assert plan(saved, f) == FileStart(offset=len(OLD), lookback=False, reason="resumed")


@pytest.mark.parametrize(
    ("born", "content", "reason"),
    [
        # removed and created anew with the saved inode number, a line as long as the old
        (222, lines(9, 2, 3), "inode-reused"),
        (222, OLD, "inode-reused"),  # even with the same bytes: born later
        (None, lines(9, 2, 3), "fingerprint-mismatch"),  # no birth times: the head differs
        (None, lines(1, 2, 9), "fingerprint-mismatch"),  # the line before the offset differs
        (111, lines(7, 8), "truncated"),  # truncated, shorter than the offset
        (111, lines(7, 8, 9, 10), "truncated"),  # truncated and grown back past the offset
    ],
)
def test_another_file_with_the_saved_inode_is_read_from_its_start(
    born: int | None, content: bytes, reason: StartReason
) -> None:
    saved_born = None if born is None else 111
    old = MemFile(PATH, 10, saved_born, bytearray(OLD))
    saved = mark(old, len(OLD), saved_at=ago(60))
    now = MemFile(PATH, 10, born, bytearray(content))
    assert plan(saved, now) == FileStart(
        offset=0,
        lookback=False,
        reason=reason,
        history_before=ago(60 + LOOKBACK_S),
        dated_from=ago(60),
    )


def test_without_a_position_of_this_boot_the_window_is_read() -> None:
    f = MemFile(PATH, 10, 111, bytearray(OLD))
    assert plan(None, f, lookback=10) == FileStart(
        offset=len(OLD) - 10,
        lookback=True,
        reason="first-start",
        history_before=ago(LOOKBACK_S),
        dated_from=NOW,
    )
    elsewhere = FileMark(path="/other.log", dev=DEV, ino=10, offset=4)
    assert plan(elsewhere, f, lookback=0).offset == len(OLD)  # type: ignore[union-attr]
    assert plan(mark(f, len(OLD)), None) is None  # missing: followed once it appears


def test_a_rotated_file_is_finished_beside_the_new_one_where_it_is_still_the_saved_one() -> None:
    old = MemFile(PATH, 10, 111, bytearray(OLD))
    saved = mark(old, len(OLD))
    old.data += lines(4)
    old.path = COPY  # renamed: kern.log.1
    new = MemFile(PATH, 11, 333, bytearray(lines(5)))
    start = plan(saved, new, old)
    assert start is not None and (start.reason, start.offset) == ("rotated", 0)
    assert start.rotated is not None
    assert (start.rotated.path, start.rotated.offset, start.rotated.ino) == (COPY, len(OLD), 10)
    # the saved inode number again, but another file (born later): not read
    impostor = MemFile(COPY, 10, 444, bytearray(OLD + lines(4)))
    assert plan(saved, new, impostor).rotated is None  # type: ignore[union-attr]
    # gone: the new file alone
    assert plan(saved, new).rotated is None  # type: ignore[union-attr]


def test_a_copytruncate_copy_is_found_by_its_content() -> None:
    f = MemFile(PATH, 10, 111, bytearray(OLD))
    saved = mark(f, len(OLD))
    f.data += lines(4)
    copy = MemFile(COPY, 12, 555, bytearray(f.data))  # copied...
    f.data[:] = lines(6, 7, 8, 9)  # ... truncated and grown back past the offset
    start = plan(saved, f, MemFile("/var/log/syslog", 13, 1, bytearray(OLD[:5])), copy)
    assert start is not None and start.reason == "truncated" and start.offset == 0
    assert start.rotated is not None and (start.rotated.path, start.rotated.ino) == (COPY, 12)
    assert start.rotated.saved_ino == 10  # its lines were written down under the saved inode


def _crashed_at_the_start() -> tuple[MemFile, FileMark, FileMark]:
    """A run read a new file from its start and died after handing its first line on,
    before the engine took it: the position is offset 0 (which any file matches), written
    down with the mark after that line (``reached``). Lines came after the crash."""
    f = MemFile(PATH, 10, 111)
    saved = mark(f, 0, saved_at=ago(60))
    f.data += lines(1)
    reached = mark(f, len(f.data))
    f.data += lines(2, 3)
    return f, saved, reached


def test_a_copy_of_a_file_saved_at_offset_0_is_found_by_the_line_reached_past_it() -> None:
    f, saved, reached = _crashed_at_the_start()
    copy = MemFile(COPY, 12, 555, bytearray(f.data))  # copied...
    f.data[:] = lines(6, 7, 8, 9)  # ... truncated and grown back past the reached line
    other = MemFile("/var/log/kern.log.2", 13, 1, bytearray(lines(4, 5)))  # another log
    start = plan(saved, f, other, copy, reached=reached)
    assert start == FileStart(
        offset=0,
        lookback=False,
        reason="truncated",
        rotated=RotatedRest(COPY, DEV, 12, 0, 10),
        history_before=ago(60 + LOOKBACK_S),
        dated_from=ago(60),
    )
    # the offset alone cannot tell: any file holds nothing at offset 0
    alone = plan(saved, f, other, copy)
    assert alone is not None and (alone.reason, alone.rotated) == ("resumed", None)


@pytest.mark.parametrize(
    ("born", "content", "reason"),
    [
        (111, b"", "truncated"),  # shorter than the reached line's end
        (111, lines(6), "truncated"),  # as long as it, another line there
        (111, lines(6, 7, 8), "truncated"),  # grown back past it: its line is not there
        (None, lines(6, 7, 8), "fingerprint-mismatch"),  # no birth times to tell more
        (222, lines(1, 2, 3), "inode-reused"),  # the same bytes, born later
    ],
)
def test_a_file_saved_at_offset_0_is_the_saved_one_only_where_it_holds_the_line_reached(
    born: int | None, content: bytes, reason: StartReason
) -> None:
    f, saved, reached = _crashed_at_the_start()
    if born is None:
        saved, reached = (msgspec.structs.replace(m, born=None) for m in (saved, reached))
    start = plan(saved, MemFile(PATH, 10, born, bytearray(content)), reached=reached)
    assert start is not None and (start.reason, start.offset) == (reason, 0)
    kept = plan(saved, f, reached=reached)  # left as it was: the saved file, from offset 0
    assert kept is not None and (kept.reason, kept.offset, kept.rotated) == ("resumed", 0, None)


def test_a_file_renamed_away_after_a_crash_at_offset_0_is_read_where_it_holds_its_line() -> None:
    f, saved, reached = _crashed_at_the_start()
    f.path = COPY  # renamed: kern.log.1
    new = MemFile(PATH, 11, 333, bytearray(lines(5)))
    start = plan(saved, new, f, reached=reached)
    assert start is not None and start.reason == "rotated"
    assert start.rotated == RotatedRest(COPY, DEV, 10, 0, 10)
    # the saved inode number again, born the same, but another content: not read
    impostor = MemFile(COPY, 10, 111, bytearray(lines(4, 5, 6)))
    assert plan(saved, new, impostor, reached=reached).rotated is None  # type: ignore[union-attr]


def test_a_reached_mark_that_is_not_past_the_saved_one_is_ignored() -> None:
    """Only a mark of the same file, further on, is evidence (a stale one is not)."""
    f, saved, reached = _crashed_at_the_start()
    f.data[:] = lines(6, 7, 8, 9)  # truncated and grown back: only the reached line tells
    for stale in (
        FileMark(path="/other.log", dev=DEV, ino=10, offset=reached.offset,
                 fingerprint=reached.fingerprint),
        FileMark(path=PATH, dev=DEV, ino=99, offset=reached.offset,
                 fingerprint=reached.fingerprint),
        FileMark(path=PATH, dev=DEV, ino=10, offset=0, fingerprint=EMPTY),
        FileMark(path=PATH, dev=DEV, ino=10, offset=reached.offset),
    ):  # fmt: skip
        assert plan(saved, f, reached=stale).reason == "resumed"  # type: ignore[union-attr]
    assert plan(saved, f, reached=reached).reason == "truncated"  # type: ignore[union-attr]


def test_a_position_without_a_fingerprint_is_not_trusted() -> None:
    """Saved by an agent that kept none: the window again, as redeliveries."""
    f = MemFile(PATH, 10, 111, bytearray(OLD))
    legacy = FileMark(path=PATH, dev=DEV, ino=10, offset=len(OLD))
    assert plan(legacy, f, lookback=20) == FileStart(
        offset=len(OLD) - 20,
        lookback=True,
        reason="unverified",
        redeliver=True,
        history_before=ago(LOOKBACK_S),
        dated_from=NOW,
    )
    shorter = MemFile(PATH, 10, 111, bytearray(lines(1)))
    assert plan(legacy, shorter).reason == "truncated"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("saved_at", "history_before", "dated_from"),
    [
        # lines dated more than file_lookback_s before the save are history
        (ago(60), ago(60 + LOOKBACK_S), ago(60)),
        # down longer than file_lookback_s: what was written meanwhile is kept
        (ago(5000), ago(5000 + LOOKBACK_S), ago(5000)),
        # saved by an agent that kept no time: dated from now, as a first start
        (None, ago(LOOKBACK_S), NOW),
        # saved "later" than now (the wall clock stepped back): never past now
        (NOW + timedelta(hours=1), ago(LOOKBACK_S), NOW),
        # never before this boot
        (BOOTED + timedelta(seconds=10), BOOTED, BOOTED + timedelta(seconds=10)),
    ],
    ids=["recent-save", "long-downtime", "saved-without-a-time", "clock-stepped-back", "boot"],
)
def test_a_new_files_history_is_dated_from_the_save(
    saved_at: datetime | None, history_before: datetime, dated_from: datetime
) -> None:
    """And the marks saved before the follower caught up carry the same time
    (``dated_from``): a crash while it reads the new file's lines leaves them no older."""
    old = MemFile(PATH, 10, 111, bytearray(OLD))
    saved = mark(old, len(OLD), saved_at=saved_at)
    rotated = MemFile(PATH, 11, 222, bytearray(lines(4)))
    start = plan(saved, rotated)
    assert start is not None and start.reason == "rotated"
    assert (start.history_before, start.dated_from) == (history_before, dated_from)


def test_the_saved_file_and_a_first_start_date_history_too() -> None:
    """The saved file resumed: what follows the offset was written since, unless a log was
    restored in place (which at offset 0 no fingerprint can tell), so the same date bound;
    none where the mark kept no time (an upgrade must not lose a downtime's lines). A first
    start dates from now, whatever was saved for another path."""
    f = MemFile(PATH, 10, 111, bytearray(OLD))
    resumed = plan(mark(f, len(OLD), saved_at=ago(60)), f)
    assert resumed is not None and resumed.reason == "resumed"
    assert (resumed.history_before, resumed.dated_from) == (ago(60 + LOOKBACK_S), ago(60))
    legacy = plan(mark(f, len(OLD)), f)
    assert legacy is not None and legacy.reason == "resumed"
    assert (legacy.history_before, legacy.dated_from) == (None, None)
    elsewhere = FileMark(path="/other.log", dev=DEV, ino=10, offset=4, saved_at=ago(60))
    first = plan(elsewhere, f)
    assert first is not None and (first.history_before, first.dated_from) == (ago(LOOKBACK_S), NOW)


TEN = lines(*range(10))
"""Ten lines of 31 bytes: 310 bytes."""


@pytest.mark.parametrize(
    ("head", "lookback", "gap"),
    [
        (310, 0, None),  # not larger than the bounds: whole
        (200, 110, None),
        (62, 62, (62, 248)),  # both bounds at a line's start
        (70, 40, (93, 279)),  # the line across the head's bound is read whole; the end
        # part starts at the first whole line
        (70, 0, (93, 310)),  # no read-back window: the head alone, then what comes
        (200, 100, None),  # the head's last line reaches into the end part: nothing skipped
    ],
)
def test_a_large_new_file_is_read_at_its_head_and_its_end(
    head: int, lookback: int, gap: tuple[int, int] | None
) -> None:
    """Never its start: the lines that followed the saved file's are there."""
    old = MemFile(PATH, 10, 111, bytearray(OLD))
    saved = mark(old, len(OLD), saved_at=ago(60))
    new = MemFile(PATH, 11, 222, bytearray(TEN))
    start = plan(saved, new, head=head, lookback=lookback)
    assert start is not None and (start.offset, start.gap) == (0, gap)
    if gap is not None:
        assert gap[0] >= head and TEN[gap[0] - 1 : gap[0]] == TEN[gap[1] - 1 : gap[1]] == b"\n"
        assert gap[1] >= len(TEN) - lookback


def test_only_a_new_file_is_cut() -> None:
    """The saved file resumes and a first start reads its window, however large the file."""
    f = MemFile(PATH, 10, 111, bytearray(TEN))
    assert plan(mark(f, 31), f, head=62, lookback=62).gap is None  # type: ignore[union-attr]
    assert plan(None, f, head=62, lookback=62).gap is None  # type: ignore[union-attr]


def test_cutting_a_large_new_file_reads_a_bounded_part_of_it() -> None:
    old = MemFile(PATH, 10, 111, bytearray(OLD))
    big = MemFile(PATH, 11, 222, bytearray(lines(*range(100_000))))
    start = plan(mark(old, len(OLD)), big, head=4096, lookback=4096)
    assert start is not None and start.gap is not None
    assert big.read_bytes <= 2 * 4096


def test_checking_a_file_reads_a_bounded_part_of_it() -> None:
    big = MemFile(PATH, 10, 111, bytearray(lines(*range(100_000))))
    saved = mark(big, big.size, limit=1024)
    assert plan(saved, big).reason == "resumed"  # type: ignore[union-attr]
    assert big.read_bytes <= 2 * 1024


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n")),
    st.integers(min_value=1, max_value=64),
    st.data(),
)
def test_the_readers_fingerprint_holds_for_the_file_it_read(
    raw_lines: list[bytes], limit: int, data: st.DataObject
) -> None:
    """Started at any line of the file, the reader's fingerprint after each later line is the
    one a check of the whole file finds; another byte in the head or in the last line makes
    the check fail, and one between them does not (the check reads two bounded parts)."""
    content = b"".join(raw_lines)
    ends = [sum(len(x) for x in raw_lines[: i + 1]) for i in range(len(raw_lines))]
    starts = [0, *ends]
    first = data.draw(st.integers(min_value=0, max_value=len(raw_lines)))
    prints = LinePrints(content, starts[first], limit)
    f = MemFile(PATH, 1, None, bytearray(content))
    for i in range(first, len(raw_lines)):
        fp = prints.line(raw_lines[i], ends[i])
        saved = FileMark(path=PATH, dev=DEV, ino=1, offset=ends[i], fingerprint=fp)
        assert holds_content(f, saved)
        assert fp.head_len == min(limit, ends[i]) and fp.tail_len == min(limit, len(raw_lines[i]))
        where = data.draw(st.integers(min_value=0, max_value=ends[i] - 1))
        changed = MemFile(PATH, 1, None, bytearray(content))
        changed.data[where] ^= 0x01
        inside = where < fp.head_len or where >= ends[i] - fp.tail_len
        assert holds_content(changed, saved) is not inside


# --------------------------------------------------------------------------- state machine


@dataclass
class Line:
    id: int
    at: datetime
    """When it was logged (its stamp)."""
    delivered: int = 0
    """Handed on as a fresh line."""
    redelivered: int = 0
    """Handed on again, known as one an earlier run handed on and never confirmed."""
    lost: bool = False
    """Its file was removed or truncated before any run read it, or a first start found it
    dated before its window: no run can."""
    history: bool = False
    """A copy of a line in a log restored into place, dated more than ``file_lookback_s``
    before the saved position: never to be delivered."""
    optional: bool = False
    """A copy of a line in a restored log dated within ``file_lookback_s`` of the save (the
    margin the rule leaves): may be delivered again."""


Plan = Callable[
    [FileMark | None, FileMark | None, MemFile | None, list[MemFile], datetime], FileStart | None
]


def real_plan(
    saved: FileMark | None,
    reached: FileMark | None,
    current: MemFile | None,
    others: list[MemFile],
    now: datetime,
) -> FileStart | None:
    return plan(saved, current, *others, now=now, reached=reached)


@dataclass(frozen=True)
class Handed:
    """A line written down as handed on and not confirmed (the follower's ``Pending``): its
    end offset, its bytes, the inode it was read from, its file's head hash there."""

    at: int
    raw: bytes
    ino: int
    head: int


@dataclass
class Step:
    """What a run read, in order: a file opened at offset 0 (``line`` None), or a line."""

    after: FileMark
    """The mark after it (the position the follower keeps in memory)."""
    content: tuple[int, int]
    """Whose content it was read in: the file (``id``) and its truncations then."""
    line: Line | None = None
    raw: bytes = b""
    handed_ino: int = 0
    """The inode an earlier run would have written it down under (a copy's: the saved one)."""
    again: Handed | None = None
    """How an earlier run wrote it down as handed on: read again, a redelivery."""
    handed: bool = False
    """Handed on (not skipped as history)."""
    rest: bool = False
    """Read in the rest of the saved file, before the file at the path."""


EVERY = 1 << 20
"""A run that dies with every line it handed on held."""


class FollowedFiles(RuleBasedStateMachine):
    """A directory with ``kern.log`` and at most a ``kern.log.1``, changed while the agent is
    down (one change of files between two runs: a second rotation would hide the file in the
    middle from the plan, which looks only at the saved file and the new one), time passing
    between runs (also longer than ``file_lookback_s``), and runs of the follower that read
    from where :func:`start_plan` says to the end, skipping the lines dated before its
    ``history_before`` as the reader does, the position saved after each line as the reader
    computes it, stamped with the run's time (and at offset 0 when it opens a file there).

    Invariants: no line is ever delivered twice; no line of restored history is delivered;
    after each run every line written before it is delivered, unless its file was removed or
    truncated in place before a run read it, or copied and truncated, or renamed, where the
    saved position did not describe that file (a first start reads the file at the path
    alone; a copy is found only by the saved content: a position past some content, or at
    offset 0 the line handed on past it), or a first start found it dated before its window.
    A run may die with its last lines handed on and not confirmed (the engine held them): the
    position stays before them, the first written down with the mark after it, and the next
    run knows each as a redelivery where it reads it again.
    """

    plan: Plan = staticmethod(real_plan)

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, MemFile] = {}
        self.freed: list[int] = []
        self.next_ino = 100
        self.clock = 1
        self.now = NOW
        self.btime = True
        self.saved: FileMark | None = None
        self.reached: FileMark | None = None
        self.describes: tuple[int, int] | None = None
        """Whose content the saved position (with ``reached``) is in (``Step.content``)."""
        self.handed: list[Handed] = []
        """The lines written down as handed on and not confirmed (``PositionFile.handed``)."""
        self.lines: list[Line] = []
        self.contents: dict[int, list[int]] = {}
        """A file's (by id()) lines, in order."""
        self.created: list[MemFile] = []
        """Every file created, kept alive so that an id() names one file for the machine's
        life (a removed file's could be handed to a new one)."""
        self.changed = False
        self.read_upto = 0
        """Lines written before the last run."""

    # ---- the model's filesystem

    def _create(self, path: str, reuse: bool) -> MemFile:
        ino = self.freed.pop() if reuse and self.freed else self._fresh()
        self.clock += 1
        f = MemFile(path, ino, self.clock if self.btime else None)
        self.contents[id(f)] = []
        self.names[path] = f
        self.created.append(f)
        return f

    def _fresh(self) -> int:
        self.next_ino += 1
        return self.next_ino

    def _lose_unread(self, f: MemFile) -> None:
        for line_id in self.contents[id(f)]:
            if self.lines[line_id].delivered == 0:
                self.lines[line_id].lost = True

    def _drop(self, f: MemFile) -> None:
        """``f`` is removed: its unread lines with it, its inode number free again."""
        self._lose_unread(f)
        del self.contents[id(f)]
        self.freed.append(f.ino)

    def _saved_for(self, f: MemFile) -> bool:
        s = self.saved
        return s is not None and (s.ino, s.born) == (f.ino, f.born)

    def _describes(self, f: MemFile) -> bool:
        """The saved position is in ``f``'s content as it is now (a run that died with a
        line of a copy held leaves it in the content the copy took away)."""
        return self.saved is not None and self.describes == (id(f), f.truncations)

    def _truncate(self, f: MemFile) -> None:
        self.contents[id(f)] = []
        f.data.clear()
        f.truncations += 1

    def _new_line(self, f: MemFile, at: datetime) -> Line:
        line = Line(len(self.lines), at)
        self.lines.append(line)
        f.data += lines(line.id)
        self.contents[id(f)].append(line.id)
        return line

    # ---- rules

    @initialize(btime=st.booleans())
    def filesystem(self, btime: bool) -> None:
        """With birth times (ext4, xfs, btrfs) or without."""
        self.btime = btime

    @rule(seconds=st.sampled_from([1.0, LOOKBACK_S - 1, LOOKBACK_S + 1, 20 * LOOKBACK_S]))
    def time_passes(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(n=st.integers(min_value=1, max_value=3))
    def append(self, n: int) -> None:
        f = self.names.get(PATH) or self._create(PATH, reuse=False)
        for _ in range(n):
            self._new_line(f, self.now)

    @precondition(lambda self: not self.changed and PATH in self.names)
    @rule()
    def truncate_in_place(self) -> None:
        f = self.names[PATH]
        self._lose_unread(f)
        self._truncate(f)
        self.changed = True

    @precondition(lambda self: not self.changed and PATH in self.names)
    @rule(reuse=st.booleans())
    def copytruncate(self, reuse: bool) -> None:
        f = self.names[PATH]
        if COPY in self.names:
            self._drop(self.names.pop(COPY))
        copy = self._create(COPY, reuse)
        copy.data[:] = f.data
        self.contents[id(copy)] = list(self.contents[id(f)])
        saved = self.saved
        telling = saved is not None and (saved.offset > 0 or self.reached is not None)
        if not (self._describes(f) and telling):
            self._lose_unread(copy)  # nothing leads to the copy
        self._truncate(f)
        self.changed = True

    @precondition(lambda self: not self.changed and PATH in self.names)
    @rule(keep_old=st.booleans(), reuse=st.booleans())
    def rotate(self, keep_old: bool, reuse: bool) -> None:
        f = self.names.pop(PATH)
        if COPY in self.names:
            self._drop(self.names.pop(COPY))
        f.path = COPY
        self.names[COPY] = f
        if not keep_old:
            self._drop(self.names.pop(COPY))
        elif not self._describes(f):
            self._lose_unread(f)
        self._create(PATH, reuse)
        self.changed = True

    @precondition(lambda self: not self.changed and PATH in self.names)
    @rule(reuse=st.booleans())
    def recreate(self, reuse: bool) -> None:
        self._drop(self.names.pop(PATH))
        self._create(PATH, reuse)
        self.changed = True

    @precondition(
        lambda self: not self.changed and PATH in self.names and bool(self.names[PATH].data)
    )
    @rule(reuse=st.booleans())
    def recreate_with_the_same_bytes(self, reuse: bool) -> None:
        """A new file whose lines repeat the old one's byte for byte (a test harness writing
        the same line again): new lines all the same. Only a birth time tells the two apart
        where the new file gets the saved inode number: without one, the lines up to the
        saved offset look handled. A position in the old content is in the new one as much,
        byte for byte."""
        old = self.names.pop(PATH)
        same = self._describes(old)
        self._drop(old)
        f = self._create(PATH, reuse)
        f.data[:] = old.data
        if same:
            self.describes = (id(f), f.truncations)
        width = len(lines(0))
        blind = not self.btime and self._saved_for(f) and same
        for i in range(len(old.data) // width):
            line = Line(len(self.lines), self.now)
            self.lines.append(line)
            self.contents[id(f)].append(line.id)
            line.lost = blind and (i + 1) * width <= self.saved.offset  # type: ignore[union-attr]
        self.changed = True

    @precondition(lambda self: not self.changed and any(x.delivered for x in self.lines))
    @rule(reuse=st.booleans())
    def restore_an_old_log(self, reuse: bool) -> None:
        """The file at the path is replaced by a log restored or copied into place: copies of
        every line delivered so far, with their own dates, then new lines may follow. A copy
        dated more than ``file_lookback_s`` before the saved position is history; one within
        it may be delivered again."""
        if PATH in self.names:
            self._drop(self.names.pop(PATH))
        f = self._create(PATH, reuse)
        saved_at = self.saved.saved_at if self.saved is not None else None
        for old in [x for x in self.lines if x.delivered and not (x.history or x.optional)]:
            copy = self._new_line(f, old.at)
            old_enough = saved_at is not None and old.at < saved_at - timedelta(seconds=LOOKBACK_S)
            copy.history, copy.optional = old_enough, not old_enough
        self.changed = True

    @rule(held=st.sampled_from([0, 1, 2, EVERY]), killed=st.booleans())
    def restart(self, held: int = 0, killed: bool = False) -> None:
        """One run: plan, read the rest of the saved file and the file at the path to their
        ends (lines dated before the plan's ``history_before`` skipped, unless handed on
        before), the position kept after each line and at offset 0 when it opens a file
        there, dated as the plan's ``dated_from`` while it reads what was there at start.
        ``held``: the run dies with its last ``held`` lines handed on and not confirmed (the
        engine held them); ``killed``: it dies right after handing the first of them on,
        before reading further; else it stops with its position saved at its last line,
        dated now (it caught up)."""
        self.changed = False
        if not (held and killed):
            self.read_upto = len(self.lines)
        current = self.names.get(PATH)
        others = [f for p, f in self.names.items() if p != PATH]
        if self.saved is None and current is not None:  # a first start: its window alone
            window = self.now - timedelta(seconds=LOOKBACK_S)
            for line_id in self.contents[id(current)]:
                line = self.lines[line_id]
                line.lost = line.lost or (line.at < window and not line.optional)
        start = type(self).plan(self.saved, self.reached, current, others, self.now)
        if start is None:
            return
        steps: list[Step] = []
        if start.rotated is not None:
            rest = self.names.get(start.rotated.path)
            assert rest is not None and rest.ino == start.rotated.ino
            steps += self._read(rest, start.rotated.offset, start.rotated.saved_ino, start)
            steps = [replace(step, rest=True) for step in steps]
        assert current is not None
        offset = min(start.offset, current.size)
        if start.lookback and offset > 0:
            nl = current.data.find(b"\n", offset - 1)
            offset = current.size if nl < 0 else nl + 1
        if offset == 0:
            at_0 = mark(current, 0, saved_at=self._dated(start))
            steps.append(Step(at_0, (id(current), current.truncations), handed_ino=current.ino))
        steps += self._read(current, offset, current.ino, start)
        stopped = self._hand_on(steps, start.history_before, held, killed)
        if stopped and steps and self.saved is not None:
            self.saved = msgspec.structs.replace(self.saved, saved_at=self.now)

    def _read(self, f: MemFile, offset: int, handed_ino: int, start: FileStart) -> list[Step]:
        data = bytes(f.data)
        prints = LinePrints(data, offset, LIMIT)
        ids = self.contents[id(f)]
        width = len(lines(0))
        end = offset
        steps = []
        for raw in data[offset:].splitlines(keepends=True):
            end += len(raw)
            fp = prints.line(raw, end)
            after = mark(f, end, saved_at=self._dated(start))
            assert after.fingerprint == fp
            line = self.lines[ids[end // width - 1]]
            steps.append(Step(after, (id(f), f.truncations), line, raw, handed_ino))
        return steps

    def _hand_on(
        self, steps: list[Step], history_before: datetime | None, held: int, killed: bool
    ) -> bool:
        """What the follower does with a run's steps: a line known as handed on before is a
        redelivery (under the inode the position named, or its file's own) and never history;
        the position moves past each line once confirmed, until the first held one: the
        position moves to its start (where the follower had a mark before it), written down
        with the mark after it; every line handed on from there is written down. Whether
        none was held (the run stopped with its position saved)."""
        known = set(self.handed)
        for step in steps:
            if step.line is None:
                continue
            fp = step.after.fingerprint
            assert fp is not None
            for ino in self._known_under(step):
                this = Handed(step.after.offset, step.raw, ino, fp.head)
                if this in known:
                    known.discard(this)
                    step.again = this
                    break
            old = history_before is not None and step.line.at < history_before
            step.handed = step.again is not None or not old
        handed = [i for i, step in enumerate(steps) if step.handed]
        first_held = handed[-min(held, len(handed))] if held and handed else None
        if killed and first_held is not None:
            steps = steps[: first_held + 1]
        prev: Step | None = None
        for i, step in enumerate(steps):
            if step.line is not None and step.handed:
                if step.again is not None:
                    step.line.redelivered += 1
                else:
                    step.line.delivered += 1
            if first_held is None or i < first_held:
                self._saved(step)
            elif step.handed:
                assert step.after.fingerprint is not None
                if i == first_held and prev is not None:
                    self._saved(prev)
                    self.reached = step.after
                self.handed.append(
                    Handed(step.after.offset, step.raw, step.after.ino, step.after.fingerprint.head)
                )
            prev = step
        return first_held is None

    def _dated(self, start: FileStart) -> datetime | None:
        """The time the marks saved before the run caught up carry."""
        return start.dated_from

    def _known_under(self, step: Step) -> Iterable[int]:
        """The inodes a line may have been written down under as handed on: the one the
        position named when it was read (a copy's lines: the saved file's), or its own (a
        run that read the copy wrote them down under it)."""
        return dict.fromkeys((step.handed_ino, step.after.ino))

    def _saved(self, step: Step) -> None:
        """The position saved after ``step``: the lines written down as handed on that it
        covers (before it, or of another inode, left behind) are forgotten, and what was
        reached past it; those that lie ahead of it are kept (``_kept``)."""
        at = step.after
        self.saved, self.reached, self.describes = at, None, step.content
        self.handed = self._kept(at, step.handed_ino, step.rest)

    def _kept(self, at: FileMark, copy_of: int, rest: bool) -> list[Handed]:
        """The lines written down as handed on that lie ahead of the position ``at``: its
        inode's past it; where it is in a copy, the copied file's past it (``copy_of``: the
        copy holds them at the same offsets), under the copy's inode; where it is in the rest
        of the saved file (``rest``), every other inode's (the file at the path's, read
        next)."""
        kept: list[Handed] = []
        for h in self.handed:
            if h.ino == at.ino:
                if h.at > at.offset:
                    kept.append(h)
                continue
            if h.ino == copy_of and h.at > at.offset:
                kept.append(replace(h, ino=at.ino))
            if rest:
                kept.append(h)
        return list(dict.fromkeys(kept))

    # ---- invariants

    @invariant()
    def no_line_is_delivered_twice(self) -> None:
        twice = [x.id for x in self.lines if x.delivered > 1]
        assert not twice, twice

    @invariant()
    def no_restored_history_is_delivered(self) -> None:
        again = [x.id for x in self.lines if x.history and x.delivered]
        assert not again, again

    @invariant()
    def every_line_written_before_the_last_run_is_delivered(self) -> None:
        missed = [
            x.id
            for x in self.lines[: self.read_upto]
            if x.delivered + x.redelivered == 0 and not (x.lost or x.history or x.optional)
        ]
        assert not missed, missed


FollowedFiles.TestCase.settings = settings(max_examples=400, stateful_step_count=40, deadline=None)
test_followed_files = FollowedFiles.TestCase


def _planned_by(plan: Plan) -> type[FollowedFiles]:
    """The machine with another plan."""

    class Planned(FollowedFiles):
        pass

    Planned.plan = staticmethod(plan)  # type: ignore[assignment]
    return Planned


def _run(cls: type[FollowedFiles], steps: Callable[[FollowedFiles], None]) -> FollowedFiles:
    m = cls()
    m.filesystem(btime=True)
    steps(m)
    return m


def _fails(m: FollowedFiles) -> bool:
    try:
        m.no_line_is_delivered_twice()
        m.no_restored_history_is_delivered()
        m.every_line_written_before_the_last_run_is_delivered()
    except AssertionError:
        return True
    return False


def test_the_machine_fails_a_plan_that_trusts_the_inode() -> None:
    """The model can fail: a plan that resumes any file with the saved inode at the saved
    offset (the follower before fingerprints) skips the line of a file created anew with the
    saved inode number and a line as long as the old one."""

    def inode_only(
        saved: FileMark | None,
        reached: FileMark | None,
        current: MemFile | None,
        others: list[MemFile],
        now: datetime,
    ) -> FileStart | None:
        if (
            saved is not None
            and current is not None
            and current.ino == saved.ino
            and current.size >= saved.offset
        ):
            return FileStart(offset=saved.offset, lookback=False, reason="resumed")
        return real_plan(saved, reached, current, others, now)

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart()
        m.recreate(reuse=True)
        m.append(1)
        assert m.saved is not None and m.names[PATH].ino == m.saved.ino  # the number reused
        m.restart()

    assert not _fails(real := _run(FollowedFiles, steps))
    assert Counter(x.delivered for x in real.lines) == Counter({1: 2})
    assert _fails(_run(_planned_by(inode_only), steps))


def _history_rule(
    rule: Callable[[FileMark, datetime], datetime | None],
) -> type[FollowedFiles]:
    """The real plan, with another ``history_before`` for a new file."""

    def dated(
        saved: FileMark | None,
        reached: FileMark | None,
        current: MemFile | None,
        others: list[MemFile],
        now: datetime,
    ) -> FileStart | None:
        start = real_plan(saved, reached, current, others, now)
        if start is None or saved is None or start.reason in ("first-start", "resumed"):
            return start
        return replace(start, history_before=rule(saved, now))

    return _planned_by(dated)


def test_the_machine_fails_a_plan_that_reads_a_restored_log_whole() -> None:
    """A new file read from its start with no date bound (the follower before this rule)
    delivers the restored copies of lines handled long before again."""

    def steps(m: FollowedFiles) -> None:
        m.append(2)
        m.restart()
        m.time_passes(20 * LOOKBACK_S)
        m.append(1)
        m.restart()
        m.restore_an_old_log(reuse=False)
        m.append(1)
        m.restart()

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    # the two copies dated long before the save are skipped; the one logged just before it
    # (within file_lookback_s: the rule's margin) is read again; the new line is read
    assert [(x.history, x.optional, x.delivered) for x in real.lines[3:]] == [
        (True, False, 0), (True, False, 0), (False, True, 1), (False, False, 1),
    ]  # fmt: skip
    assert _fails(_run(_history_rule(lambda _saved, _now: None), steps))


def test_the_machine_fails_a_plan_that_dates_history_from_now() -> None:
    """Dating a new file's history from now instead of the save loses the lines written
    during a downtime longer than ``file_lookback_s``."""

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart()
        m.rotate(keep_old=False, reuse=False)
        m.append(1)
        m.time_passes(20 * LOOKBACK_S)
        m.restart()

    assert not _fails(_run(FollowedFiles, steps))
    from_now = _history_rule(lambda _saved, now: now - timedelta(seconds=LOOKBACK_S))
    assert _fails(_run(from_now, steps))


def test_the_machine_fails_a_plan_that_ignores_the_line_reached_past_offset_0() -> None:
    """A run read a new file from its start and died with its first line handed on and held
    (the position at offset 0); the file was copied and truncated while down and grew back.
    A plan that looks at the saved offset alone (the follower before the reached mark)
    resumes the regrown file at 0, and the lines written to the copy after the crash are
    never read."""

    blind = _planned_by(lambda saved, _reached, *files_now: real_plan(saved, None, *files_now))

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart(held=1)
        assert m.saved is not None and m.saved.offset == 0 and m.reached is not None
        m.append(2)  # after the crash: in the copy only
        m.copytruncate(reuse=False)
        m.append(3)  # grown back past the reached line
        m.restart()

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    assert [(x.delivered, x.redelivered, x.lost) for x in real.lines] == [
        (1, 1, False), (1, 0, False), (1, 0, False), (1, 0, False), (1, 0, False),
        (1, 0, False),
    ]  # fmt: skip
    assert _fails(_run(blind, steps))


def test_the_machine_fails_a_follower_that_knows_a_copys_line_under_the_saved_inode_alone() -> None:
    """A run read the copy's rest and died with its line held, the position still naming
    the saved file: the line was written down under the copy's inode. A follower that looks
    for it under the saved inode alone delivers it twice."""

    class SavedInodeOnly(FollowedFiles):
        def _known_under(self, step: Step) -> Iterable[int]:
            return (step.handed_ino,)

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart()
        m.append(1)  # after the stop: in the copy only
        m.copytruncate(reuse=False)
        m.append(1)
        m.restart(held=2)
        m.restart()

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    assert [(x.delivered, x.redelivered) for x in real.lines] == [(1, 0), (1, 1), (1, 1)]
    assert _fails(_run(SavedInodeOnly, steps))


def test_the_machine_fails_a_follower_that_dates_its_catching_up_from_now() -> None:
    """Down longer than ``file_lookback_s``, the file rotated meanwhile: a run reading the
    new file's lines dies after the first. Marks dated by the time they were saved (the
    follower before ``dated_from``) make the lines it had not read yet history."""

    class DatedNow(FollowedFiles):
        def _dated(self, start: FileStart) -> datetime | None:
            return self.now

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart()
        m.rotate(keep_old=False, reuse=False)
        m.append(2)
        m.time_passes(20 * LOOKBACK_S)
        m.restart(held=EVERY, killed=True)
        m.restart()

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    assert [(x.delivered, x.redelivered) for x in real.lines] == [(1, 0), (1, 1), (1, 0)]
    assert _fails(_run(DatedNow, steps))


def test_the_machine_fails_a_follower_that_forgets_the_copied_files_lines_in_the_copy() -> None:
    """A run read a file from its start and died with its lines handed on and held (the
    position at offset 0, the lines written down under the file's inode); the file was
    copied and truncated. The next run read the copy, the engine took its first line and
    held the second, and it died: the position moved into the copy. A follower that forgets
    the saved file's lines past it there (of another inode: left behind, as after a
    rotation) delivers the third again as a fresh line; the copy holds them at the same
    offsets, written down under its inode they come back as redeliveries. (The sequence
    hypothesis found, on a filesystem without birth times.)"""

    class ForgetsTheCopied(FollowedFiles):
        def _kept(self, at: FileMark, copy_of: int, rest: bool) -> list[Handed]:
            return super()._kept(at, at.ino, rest)

    def steps(m: FollowedFiles) -> None:
        m.filesystem(btime=False)
        m.append(1)
        m.truncate_in_place()
        m.append(1)
        m.append(1)
        m.append(1)
        m.restart(held=EVERY, killed=False)
        m.copytruncate(reuse=False)
        m.restart(held=2, killed=True)
        assert m.saved is not None and m.saved.ino == m.names[COPY].ino != m.names[PATH].ino
        m.restart(held=0, killed=False)

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    assert [(x.delivered, x.redelivered, x.lost) for x in real.lines] == [
        (0, 0, True), (1, 1, False), (1, 2, False), (1, 1, False),
    ]  # fmt: skip
    forgetful = _run(ForgetsTheCopied, steps)
    assert _fails(forgetful) and forgetful.lines[3].delivered == 2


@pytest.mark.parametrize("change", ["rotate", "copytruncate"])
def test_the_machine_fails_a_follower_that_forgets_the_new_files_lines_in_the_rest(
    change: str,
) -> None:
    """The file was rotated (the old one beside) or copied and truncated while down, and
    written to again. A run read the saved file's rest, then the file at the path, and died
    with every line handed on and held; the next run took the rest's first line, held the
    next, and died. A follower whose position, moved into the rest, forgets the lines
    written down of another inode (left behind, as they are once it is in the file at the
    path) delivers the new file's lines again as fresh ones: they lie ahead, read after the
    rest. (The siblings 5,000 examples of the machine found.)"""

    class ForgetsTheNew(FollowedFiles):
        def _kept(self, at: FileMark, copy_of: int, rest: bool) -> list[Handed]:
            return super()._kept(at, copy_of, rest=False)

    def steps(m: FollowedFiles) -> None:
        m.append(1)
        m.restart()
        m.append(2)  # after the stop: in the rest only
        if change == "rotate":
            m.rotate(keep_old=True, reuse=False)
        else:
            m.copytruncate(reuse=False)
        m.append(2)
        m.restart(held=EVERY)
        m.restart(held=3, killed=True)
        m.restart()

    real = _run(FollowedFiles, steps)
    assert not _fails(real)
    assert [(x.delivered, x.redelivered) for x in real.lines] == [
        (1, 0), (1, 1), (1, 2), (1, 1), (1, 1),
    ]  # fmt: skip
    forgetful = _run(ForgetsTheNew, steps)
    assert _fails(forgetful) and [x.delivered for x in forgetful.lines[3:]] == [2, 2]
