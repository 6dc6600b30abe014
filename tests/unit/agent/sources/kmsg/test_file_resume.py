"""A followed kernel-log file across agent restarts: the next run resumes at the saved offset
(lines written while the agent was down are read and dated by their own stamp), a file rotated
or truncated meanwhile is read completely, a first start reads back a bounded window, and a
line whose handling was not confirmed before a crash is redelivered and counted once; an
NVSwitch SXid line is handled once the sink returned, and redelivered after a crash before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import (
    GpuIdentity,
    Inventory,
    Observation,
    SxidObservation,
    XidObservation,
)
from gpuhealth.agent.sources.kmsg.file_start import FileMark
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import (
    KMSG_FILE_SKIPPED_BYTES,
    KMSG_LOOKBACK_OLD,
    KMSG_REDELIVERED,
    KMSG_REPLAYED,
    KMSG_SXIDS,
    KMSG_XIDS,
    NAME,
    Ahead,
    KmsgPosition,
    KmsgSource,
    PositionFile,
)
from gpuhealth.agent.state_store import StateStore
from tests.support.clock import FakeClock
from tests.support.crash_points import Crash, WriteLog
from tests.support.kmsg_files import mark_at, prints_of
from tests.support.sinks import taking
from tests.support.wait import until

PCI = "00000000:1B:00.0"
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
BOOT = "boot-a"


def line(xid: int, ago_s: float | None = None, tag: str = "") -> str:
    """A kern.log line (rsyslog's RFC 3339 stamp ``ago_s`` before NOW; None: no stamp)."""
    text = f"NVRM: Xid (PCI:0000:1b:00): {xid}, pid={xid}, name=p, {tag or 'fault'}\n"
    if ago_s is None:
        return text
    stamp = (NOW - timedelta(seconds=ago_s)).isoformat(timespec="microseconds")
    return f"{stamp} gpu-node kernel: {text}"


def sxid_line(code: int = 12028, ago_s: float | None = None) -> str:
    """An NVSwitch SXid headline (non-fatal) as kern.log has it."""
    text = (
        f"nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): {code}, Non-fatal, Link 32 egress"
        " non-posted PRIV error (First)\n"
    )
    if ago_s is None:
        return text
    stamp = (NOW - timedelta(seconds=ago_s)).isoformat(timespec="microseconds")
    return f"{stamp} gpu-node kernel: {text}"


def settings(**extra: object) -> KmsgSettings:
    return KmsgSettings(file_poll_interval_s=0.005, file_poll_max_s=0.05, **extra)  # type: ignore[arg-type]


async def follow_all(
    log: Path,
    state: Path,
    until_obs: int,
    settle_s: float = 0.05,
    *,
    later_s: float = 0.0,
    **extra: object,
) -> tuple[KmsgSource, list[Observation]]:
    """Every observation of one run (XIDs and SXids) once ``until_obs`` came; the run starts
    ``later_s`` after NOW."""
    # booted two hours before NOW
    clock = FakeClock(NOW + timedelta(seconds=later_s), monotonic_start=7200.0 + later_s)
    src = KmsgSource(str(log), settings(**extra), clock, position=KmsgPosition(state, BOOT))
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: src.ready, "the follower to attach")
        await until(lambda: len(out) >= until_obs, f"{until_obs} observations")
        await asyncio.sleep(settle_s)  # room for one too many
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return src, out


async def follow(
    log: Path, state: Path, until_xids: int, settle_s: float = 0.05, **extra: object
) -> tuple[KmsgSource, list[XidObservation]]:
    src, out = await follow_all(log, state, until_xids, settle_s, **extra)  # type: ignore[arg-type]
    return src, [o for o in out if isinstance(o, XidObservation)]


def append(log: Path, *lines: str) -> None:
    with log.open("a") as f:
        f.write("".join(lines))


async def test_a_restart_resumes_where_the_last_run_stopped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30) + "eth0: link up\n" + line(48, 20))
    _, first = await follow(log, tmp_path, 2)
    assert [o.xid for o in first] == [79, 48]
    append(log, "usb 1-1: new device\n", line(62, 10))  # while the agent is down
    src, again = await follow(log, tmp_path, 1)
    assert [(o.xid, o.at) for o in again] == [(62, NOW - timedelta(seconds=10))]
    assert src.counters.value(KMSG_REPLAYED) == 1
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None
    assert saved.file.offset == log.stat().st_size and saved.handed == ()


async def test_a_file_rotated_while_down_is_read_to_its_end_then_the_new_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    append(log, line(48, 20))  # after the agent stopped, before the rotation
    log.rename(tmp_path / "kern.log.1")
    log.write_text(line(62, 10))
    _, again = await follow(log, tmp_path, 2)
    assert [o.xid for o in again] == [48, 62]


async def test_a_file_truncated_while_down_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 300 + "\n" + line(79, 30))
    await follow(log, tmp_path, 1)
    with log.open("r+") as f:  # copytruncate
        f.truncate(0)
    append(log, line(64, 5))
    _, again = await follow(log, tmp_path, 1)
    assert [o.xid for o in again] == [64]


async def test_a_new_file_after_a_long_downtime_is_read_from_its_start(tmp_path: Path) -> None:
    """Lines written while the agent was down longer than ``file_lookback_s`` are dated from
    the save, not from now: none is lost."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None and saved.file.saved_at == NOW
    log.rename(tmp_path / "kern.log.1")
    log.write_text(line(48, -600) + line(62, -3000))  # 10 and 50 minutes after the save
    src, again = await follow(log, tmp_path, 2, later_s=3600)  # back an hour later
    assert [o.xid for o in again] == [48, 62]
    assert src.counters.value(KMSG_LOOKBACK_OLD) == 0


async def test_a_restored_log_skips_the_history_the_last_run_had_passed(tmp_path: Path) -> None:
    """A log copied into place carries lines dated long before the save: skipped, counted,
    logged once with their number; what was written since is read."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    restored = line(13, 7000) + line(31, 4000) + "eth0: link up\n" + line(43, 3000)
    log.unlink()
    log.write_text(restored + line(94, -60))  # then a line a minute after the save
    with capture_logs() as logs:
        src, again = await follow(log, tmp_path, 1, later_s=120)
    assert [o.xid for o in again] == [94]
    assert src.counters.value(KMSG_LOOKBACK_OLD) == 3
    skipped = [e for e in logs if e["event"] == "kmsg_file_history_skipped"]
    assert [e["lines"] for e in skipped] == [3]
    # another inode, or the old number handed out again (the filesystem decides)
    assert skipped[0]["reason"] in {"rotated", "inode-reused", "fingerprint-mismatch"}
    assert skipped[0]["dated_before"] == (NOW - timedelta(seconds=300)).isoformat()


async def test_a_large_new_file_is_read_at_its_head_and_its_end(tmp_path: Path) -> None:
    """Larger than ``file_new_head_bytes`` + ``file_lookback_bytes``: its first lines (those
    after the rotation) and its last are read, the middle skipped, counted and logged."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path, 1)
    log.rename(tmp_path / "kern.log.1")
    filler = "usb 1-1: new high-speed USB device number 2 using xhci_hcd\n" * 100
    head, middle, end = line(48, 20) + filler, line(62, 15) + filler, filler + line(94, 5)
    log.write_text(head + middle + end)
    with capture_logs() as logs:
        src, again = await follow(
            log, tmp_path, 2, settle_s=0.2, file_new_head_bytes=4096, file_lookback_bytes=4096
        )
    assert [o.xid for o in again] == [48, 94]
    gaps = [e for e in logs if e["event"] == "kmsg_file_gap"]
    assert len(gaps) == 1 and gaps[0]["head_end"] >= 4096
    size = log.stat().st_size
    assert gaps[0]["tail_start"] >= size - 4096
    skipped = gaps[0]["tail_start"] - gaps[0]["head_end"]
    assert src.counters.value(KMSG_FILE_SKIPPED_BYTES) == skipped > len(middle)
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None and saved.file.offset == size


async def test_a_first_start_reads_back_a_bounded_window(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    beyond = line(31, 60) * 200  # within the time window, not within the byte window
    log.write_text(
        beyond
        + line(43, 9000)  # before this boot (two hours ago)
        + line(13, 600)  # this boot, before the window
        + line(79, 60)
        + line(48)  # no stamp: the byte window bounds it
        + line(94, 1)
    )
    window = len(line(43, 9000) + line(13, 600) + line(79, 60) + line(48) + line(94, 1)) + 10
    src, obs = await follow(log, tmp_path, 3, file_lookback_bytes=window)
    assert [o.xid for o in obs] == [79, 48, 94]
    assert obs[0].at == NOW - timedelta(seconds=60) and obs[1].at == NOW
    assert src.counters.value(KMSG_LOOKBACK_OLD) == 2  # 43 and 13; the cut line 31 is not read
    assert src.counters.value(KMSG_XIDS) == 3


async def test_without_a_position_store_the_window_is_read_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 60))
    clock = FakeClock(NOW, monotonic_start=7200.0)
    src = KmsgSource(str(log), settings(), clock)
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: len(out) == 1, "the read-back XID")
        append(log, line(48))
        await until(lambda: len(out) == 2, "the live XID")
    finally:
        task.cancel()
    assert [o.xid for o in out if isinstance(o, XidObservation)] == [79, 48]


def _crashed_while_handing_on(state: Path, log: Path, text: str) -> None:
    """The position a run leaves when it dies after handing ``text`` (the file's last line)
    to the sink and before saving past it."""
    st = log.stat()
    end = st.st_size
    pos = KmsgPosition(state, BOOT)
    if end > len(text):  # a first line has no position before it
        pos.save_file(mark_at(log, end - len(text)))
    head = prints_of(log.read_bytes())[end].head
    pos.handling(end, text.rstrip("\n"), ino=st.st_ino, head=head)


async def test_a_line_handed_on_before_a_crash_is_redelivered_and_counted_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(13, 30) + line(79, 20))
    _crashed_while_handing_on(tmp_path, log, line(79, 20))
    src, obs = await follow(log, tmp_path, 1)
    assert [(o.xid, o.redelivered) for o in obs] == [(79, True)]
    assert src.counters.value(KMSG_REDELIVERED) == 1 and src.counters.value(KMSG_XIDS) == 0

    engine = HealthEngine(HealthSettings(), FakeClock(NOW))
    ident = GpuIdentity(index=0, uuid=UUID, model="H100", pci_bus_id=PCI)
    engine.observe(Inventory(source="sim", gpus=(ident,)))
    assert engine.observe(obs[0]) != []  # the first run's verdict never reached the store
    assert engine.observe(obs[0]) == []  # it had: counted once
    assert engine.xid_counts() == {(UUID, 79): 1}


async def test_other_text_at_the_pending_position_is_a_new_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 20))
    _crashed_while_handing_on(tmp_path, log, line(79, 20))
    log.write_text(line(48, 20, tag="other"))  # rewritten in place, same length class
    src, obs = await follow(log, tmp_path, 1)
    assert [(o.xid, o.redelivered) for o in obs] == [(48, False)]
    assert src.counters.value(KMSG_REDELIVERED) == 0


async def test_a_line_whose_handling_failed_is_read_again_by_the_next_run(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 20))
    src = KmsgSource(str(log), settings(), FakeClock(NOW), position=KmsgPosition(tmp_path, BOOT))

    def failing(_: Observation) -> None:
        raise RuntimeError("the engine failed")

    with pytest.raises(RuntimeError):
        await asyncio.wait_for(src.run(failing), 10)
    _, obs = await follow(log, tmp_path, 1)
    # handed on and never confirmed: a redelivery, which the engine handles (nothing latched)
    assert [(o.xid, o.redelivered) for o in obs] == [(79, True)]


def taking_xids(writes: WriteLog, held: int) -> Callable[[Observation], None]:
    """An engine that notes each XID handed on and takes them ``held`` at a time (0 or 1: at
    once; more: the first wait, as without a GPU inventory)."""
    waiting: list[XidObservation] = []

    def engine(obs: Observation) -> None:
        if not isinstance(obs, XidObservation):
            return
        writes.note("handed", obs.xid)
        waiting.append(obs)
        if len(waiting) >= held:
            for o in waiting:
                assert o.on_taken is not None
                o.on_taken()
            waiting.clear()

    return engine


async def crashes_of(
    src: KmsgSource, engine: Callable[[Observation], None], writes: WriteLog, xids: int
) -> list[Crash]:
    """Every state a SIGKILL can leave while ``src`` hands ``xids`` XIDs on to ``engine``
    (noting them in ``writes``, its store's write log)."""
    task = asyncio.create_task(src.run(engine))
    try:
        await until(lambda: writes.count("handed") == xids, "every XID")
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    crashes = list(writes.crashes())
    assert len(crashes) >= xids
    return crashes


@pytest.mark.parametrize("held", [0, 3], ids=["taken-at-once", "held-until-the-third"])
async def test_a_crash_after_any_write_counts_no_line_twice(tmp_path: Path, held: int) -> None:
    """Every state a SIGKILL can leave: the store as it is after each of the first run's
    writes. The next run from there hands on every line the first did not, and none that the
    first run had handed on as a fresh line again (such a line may come back as a redelivery).
    ``held``: the engine holds the first XIDs (no GPU inventory yet) and takes them together
    with the ``held``-th, so several are handed on and unconfirmed at once."""
    xids = [79, 48, 62, 64, 74, 94, 95]
    log = tmp_path / "kern.log"
    log.write_text("".join(line(x, 40 - i) + "eth0: link up\n" for i, x in enumerate(xids)))
    store = StateStore(tmp_path / "first")
    writes = WriteLog(store)
    engine = taking_xids(writes, held)
    src = KmsgSource(
        str(log), settings(), FakeClock(NOW, 7200.0), position=KmsgPosition(store, BOOT)
    )
    for crash in await crashes_of(src, engine, writes, len(xids)):
        before = crash.handed
        state = crash.restore(tmp_path / f"crash-{crash.n}", NAME, BOOT)
        missing = [x for x in xids if x not in before]
        _, obs = await follow(log, state, len(missing))
        fresh = [o.xid for o in obs if not o.redelivered]
        assert set(missing) <= {o.xid for o in obs}, (crash.n, before)
        assert not before & set(fresh), (crash.n, before, fresh)
        assert len(fresh) == len(set(fresh))


async def test_the_position_moves_past_an_sxid_line_once_the_sink_returned(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30) + sxid_line(ago_s=20) + "eth0: link up\n")
    src, obs = await follow_all(log, tmp_path, 2)
    assert [type(o).__name__ for o in obs] == ["XidObservation", "SxidObservation"]
    sx = obs[1]
    assert isinstance(sx, SxidObservation) and (sx.sxid, sx.redelivered) == (12028, False)
    assert src.counters.value(KMSG_SXIDS) == 1
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None
    assert saved.file.offset == log.stat().st_size and saved.handed == ()
    append(log, line(48, 10))
    _, again = await follow_all(log, tmp_path, 1)
    assert [(type(o).__name__, getattr(o, "xid", None)) for o in again] == [("XidObservation", 48)]


async def test_an_sxid_line_handed_on_before_a_crash_is_redelivered(tmp_path: Path) -> None:
    """The run wrote the SXid line down as handed on and died before the sink returned: the
    next run hands it on again, as a redelivery, and the XID before it not at all."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30) + sxid_line(ago_s=20))
    _crashed_while_handing_on(tmp_path, log, sxid_line(ago_s=20))
    src, obs = await follow_all(log, tmp_path, 1)
    assert [(type(o).__name__, getattr(o, "redelivered", None)) for o in obs] == [
        ("SxidObservation", True)
    ]
    assert src.counters.value(KMSG_SXIDS) == 1 and src.counters.value(KMSG_XIDS) == 0
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None and saved.file is not None
    assert saved.file.offset == log.stat().st_size and saved.handed == ()


async def test_an_sxid_line_whose_sink_raised_is_redelivered_by_the_next_run(
    tmp_path: Path,
) -> None:
    """The same state reached through the real path: the sink raised on the SXid line."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30) + sxid_line(ago_s=20))
    src = KmsgSource(
        str(log), settings(), FakeClock(NOW, 7200.0), position=KmsgPosition(tmp_path, BOOT)
    )
    got: list[Observation] = []

    def failing_on_sxid(obs: Observation) -> None:
        if isinstance(obs, SxidObservation):
            raise RuntimeError("the engine failed")
        taking(got)(obs)

    with pytest.raises(RuntimeError):
        await asyncio.wait_for(src.run(failing_on_sxid), 10)
    assert [o.xid for o in got if isinstance(o, XidObservation)] == [79]
    _, obs = await follow_all(log, tmp_path, 1)
    assert [(type(o).__name__, getattr(o, "redelivered", None)) for o in obs] == [
        ("SxidObservation", True)
    ]


async def test_a_crash_after_any_write_across_a_rotation_counts_no_line_twice(
    tmp_path: Path,
) -> None:
    """As above, with the file rotated under the run: the new file's first XID ends at a
    smaller offset than the old file's mark (offsets of two inodes are not comparable)."""
    old = [79, 48, 62]
    log = tmp_path / "kern.log"
    log.write_text("x" * 400 + "\n" + "".join(line(x, 40 - i) for i, x in enumerate(old)))
    store = StateStore(tmp_path / "first")
    writes = WriteLog(store)
    engine = taking_xids(writes, held=0)
    src = KmsgSource(
        str(log), settings(), FakeClock(NOW, 7200.0), position=KmsgPosition(store, BOOT)
    )
    task = asyncio.create_task(src.run(engine))
    try:
        await until(lambda: writes.count("handed") == len(old), "the old file's XIDs")
        log.rename(tmp_path / "kern.log.1")
        log.write_text(line(94, 5))
        await until(lambda: writes.count("handed") == len(old) + 1, "the new XID")
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    xids = [*old, 94]
    for crash in writes.crashes():
        before = crash.handed
        state = crash.restore(tmp_path / f"crash-{crash.n}", NAME, BOOT)
        missing = [x for x in xids if x not in before]
        _, obs = await follow(log, state, len(missing), settle_s=0.3)
        fresh = [o.xid for o in obs if not o.redelivered]
        assert set(missing) <= {o.xid for o in obs}, (crash.n, before)
        assert not before & set(fresh), (crash.n, before, fresh)


async def test_a_crash_while_reading_a_new_files_lines_after_a_long_downtime_skips_none(
    tmp_path: Path,
) -> None:
    """Down an hour, the file rotated meanwhile: the new file's lines are dated long before
    the run that reads them. Every state that run's crash can leave, the next run reads each
    line the first did not hand on: none of the downtime's lines is history for it (the
    position saved while the run caught up is dated as the one it started from)."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 30))
    await follow(log, tmp_path / "first", 1)
    log.rename(tmp_path / "kern.log.1")
    xids = [48, 62, 64]  # written 10, 20 and 30 minutes after the save
    log.write_text("".join(line(x, -600 * (i + 1)) for i, x in enumerate(xids)))
    store = StateStore(tmp_path / "first")
    writes = WriteLog(store)
    engine = taking_xids(writes, held=0)
    clock = FakeClock(NOW + timedelta(seconds=3600), monotonic_start=7200.0 + 3600)
    src = KmsgSource(str(log), settings(), clock, position=KmsgPosition(store, BOOT))
    for crash in await crashes_of(src, engine, writes, len(xids)):
        state = crash.restore(tmp_path / f"crash-{crash.n}", NAME, BOOT)
        missing = [x for x in xids if x not in crash.handed]
        got, obs = await follow(log, state, len(missing), later_s=3660)
        assert set(missing) <= {o.xid for o in obs}, (crash.n, crash.handed)
        assert got.counters.value(KMSG_LOOKBACK_OLD) == 0, crash.n


async def _held_run(log: Path, store: StateStore, xids: int) -> PositionFile:
    """A run that hands ``xids`` XIDs on and dies with none taken: the position it leaves."""
    writes = WriteLog(store)
    src = KmsgSource(
        str(log), settings(), FakeClock(NOW, 7200.0), position=KmsgPosition(store, BOOT)
    )
    await crashes_of(src, taking_xids(writes, held=xids + 1), writes, xids)
    saved = KmsgPosition(store, BOOT).load()
    assert saved is not None and len(saved.handed) == xids
    return saved


async def _no_held_line_is_fresh_after_a_crash(
    log: Path, store: StateStore, xids: list[int]
) -> None:
    """A run reads again the ``xids`` a held run handed on: the engine takes the first and
    holds the others. Every state its crash can leave, the run after it hands each XID not
    taken on again, and none as a fresh line."""
    writes = WriteLog(store)

    def engine(obs: Observation) -> None:
        if not isinstance(obs, XidObservation):
            return
        assert obs.redelivered and obs.on_taken is not None
        writes.note("handed", obs.xid)
        if obs.xid == xids[0]:
            writes.note("taken", obs.xid)
            obs.on_taken()

    src = KmsgSource(
        str(log), settings(), FakeClock(NOW, 7200.0), position=KmsgPosition(store, BOOT)
    )
    for crash in await crashes_of(src, engine, writes, len(xids)):
        state = crash.restore(log.parent / f"crash-{crash.n}", NAME, BOOT)
        missing = [x for x in xids if x not in crash.taken]
        _, obs = await follow(log, state, len(missing))
        assert set(missing) <= {o.xid for o in obs}, (crash.n, crash.taken)
        fresh = [o.xid for o in obs if not o.redelivered]
        assert fresh == [], (crash.n, crash.handed, fresh)


async def test_a_crash_while_reading_the_copy_of_a_file_counts_none_of_its_held_lines_twice(
    tmp_path: Path,
) -> None:
    """A run read a file from its start and died with its three XIDs handed on, none taken
    (its position at offset 0, the lines written down under the file's inode). The file was
    copied and truncated while down. The next run reads the copy (its lines written down
    under the saved inode: redeliveries), the engine takes the first and holds the others,
    and it dies: moving the position into the copy forgets none of the saved file's lines
    past it, which the copy holds at the same offsets."""
    xids = [79, 48, 62]
    log = tmp_path / "kern.log"
    log.write_text("".join(line(x, 40 - i) for i, x in enumerate(xids)))
    store = StateStore(tmp_path / "first")
    saved = await _held_run(log, store, len(xids))
    assert saved.file is not None and saved.file.offset == 0 and saved.reached is not None
    (tmp_path / "kern.log.1").write_bytes(log.read_bytes())  # copied...
    with log.open("r+b") as f:
        f.truncate(0)  # ... and truncated
    await _no_held_line_is_fresh_after_a_crash(log, store, xids)


@pytest.mark.parametrize("change", ["rotate", "copytruncate"])
async def test_a_crash_in_the_rest_of_the_saved_file_forgets_no_held_line_of_the_new_one(
    tmp_path: Path, change: str
) -> None:
    """The file was rotated (renamed, a new file at the path) or copied and truncated (and
    written to again) while the agent was down. A run read the saved file's rest, then the
    file at the path, and died with every XID handed on, none taken. The next run takes the
    rest's XID, holds the new file's, and dies: the position moved into the rest keeps the
    lines written down of the file read after it."""
    log = tmp_path / "kern.log"
    log.write_text(line(79, 40))
    store = StateStore(tmp_path / "first")
    await follow(log, tmp_path / "first", 1)
    append(log, line(48, 30))  # after the stop: in the rest only
    if change == "rotate":
        log.rename(tmp_path / "kern.log.1")
    else:
        (tmp_path / "kern.log.1").write_bytes(log.read_bytes())
        with log.open("r+b") as f:
            f.truncate(0)
    append(log, line(62, 20))
    xids = [48, 62]
    await _held_run(log, store, len(xids))
    await _no_held_line_is_fresh_after_a_crash(log, store, xids)


@pytest.mark.parametrize(
    ("ahead", "kept"),
    [
        # in the file at the path: its own lines past the mark; every other inode's behind
        (None, [(200, 5)]),
        # in the rest of a copy of inode 9, beside the file at the path (7): the copied
        # file's past the mark, under the copy's inode; every other inode's as they were
        (Ahead(copy_of=9, rest=True), [(200, 5), (50, 9), (300, 5), (300, 9), (10, 7)]),
        # in the renamed saved file itself, beside a new file at the path
        (Ahead(copy_of=5, rest=True), [(200, 5), (50, 9), (300, 9), (10, 7)]),
    ],
    ids=["the-file-at-the-path", "a-copys-rest", "a-renamed-files-rest"],
)
def test_a_position_keeps_the_lines_written_down_ahead_of_it(
    tmp_path: Path, ahead: Ahead | None, kept: list[tuple[int, int]]
) -> None:
    """Moved to offset 100 of inode 5: which lines handed on and not confirmed stay written
    down (the next start reads them again, as redeliveries)."""
    pos = KmsgPosition(tmp_path, BOOT)
    for at, ino in [(50, 5), (200, 5), (50, 9), (300, 9), (10, 7)]:
        pos.handling(at, str(at), ino=ino, head=1)
    pos.save_file(FileMark(path="/var/log/kern.log", dev=1, ino=5, offset=100), ahead=ahead)
    saved = KmsgPosition(tmp_path, BOOT).load()
    assert saved is not None
    assert [(p.at, p.ino) for p in saved.handed] == kept
