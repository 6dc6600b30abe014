"""/dev/kmsg's ring buffer is read from its oldest record at start: XIDs logged while the agent
was down are reported once, never again by a later run of the same boot.

The device is a SEQPACKET socket pair: like /dev/kmsg it hands out one record per read, blocks
in select and answers EAGAIN when drained; each open presents the whole buffer again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuhealth.agent.health.engine import HELD_XIDS, HealthEngine, HealthSettings
from gpuhealth.agent.observations import (
    GpuIdentity,
    Inventory,
    Observation,
    SxidObservation,
    XidObservation,
)
from gpuhealth.agent.sources.kmsg.parser import record_seq, record_time_us, record_wall_time
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import (
    KMSG_REDELIVERED,
    KMSG_REPLAYED,
    KMSG_SKIPPED,
    KMSG_XIDS,
    NAME,
    KmsgPosition,
    KmsgSource,
)
from gpuhealth.agent.state_store import StateStore
from tests.support.clock import FakeClock
from tests.support.crash_points import WriteLog
from tests.support.sinks import taking
from tests.support.wait import until

PCI = "00000000:1B:00.0"
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def rec(seq: int, text: str, caller: str = "") -> bytes:
    return f"4,{seq},{5678901 + seq},-{caller};{text}\n".encode()


def xid(n: int) -> str:
    return f"NVRM: Xid (PCI:0000:1b:00): {n}, pid=42, name=python3, fault {n}"


class FakeKmsg:
    """The ring buffer; ``open`` is a fresh /dev/kmsg descriptor positioned at its start."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = list(records)
        self._writers: list[socket.socket] = []
        self._readers: list[socket.socket] = []

    def open(self, path: str) -> int:
        r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r.setblocking(False)
        for record in self.records:
            w.send(record)
        self._writers.append(w)
        self._readers.append(r)
        return r.detach()  # the follower closes it

    def log(self, record: bytes) -> None:
        self.records.append(record)
        for w in self._writers:
            with contextlib.suppress(BrokenPipeError):  # that descriptor's follower closed it
                w.send(record)

    def close(self) -> None:
        for w in self._writers:
            w.close()


async def follow_obs(
    dev: FakeKmsg,
    position: KmsgPosition | None,
    until_xids: int,
    *,
    then: bytes | None = None,
    clock: FakeClock | None = None,
) -> tuple[KmsgSource, list[XidObservation]]:
    src = KmsgSource(
        "/dev/kmsg",
        KmsgSettings(select_timeout_s=0.05),
        clock or FakeClock(),
        position=position,
        open_device=dev.open,
    )
    out: list[Observation] = []
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: src.ready, "the follower to attach")
        if then is not None:
            await until(lambda: len(out) >= until_xids - 1, "the replay")
            dev.log(then)
        await until(lambda: len(out) >= until_xids, f"{until_xids} XIDs")
        await asyncio.sleep(0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return src, [o for o in out if isinstance(o, XidObservation)]


async def follow(
    dev: FakeKmsg, position: KmsgPosition | None, until_xids: int, *, then: bytes | None = None
) -> tuple[KmsgSource, list[int]]:
    src, obs = await follow_obs(dev, position, until_xids, then=then)
    return src, [o.xid for o in obs]


def saved_seq(state_dir: Path, boot_id: str) -> int | None:
    saved = KmsgPosition(state_dir, boot_id).load()
    return None if saved is None else saved.seq


BUFFER = [
    rec(1, "Linux version 6.1.0"),
    rec(2, xid(79)),
    rec(3, "eth0: link up", caller=",caller=T1"),
    rec(4, xid(48), caller=",caller=C3"),
    rec(5, "usb 1-1: new device"),
]


async def test_records_logged_before_start_are_reported_then_live_ones(tmp_path: Path) -> None:
    dev = FakeKmsg(BUFFER)
    pos = KmsgPosition(tmp_path, "boot-a")
    src, xids = await follow(dev, pos, 3, then=rec(6, xid(62)))
    dev.close()
    assert xids == [79, 48, 62]
    assert src.counters.value(KMSG_REPLAYED) == 2  # 62 was logged after start
    assert src.counters.value(KMSG_XIDS) == 3
    assert saved_seq(tmp_path, "boot-a") == 6


async def test_a_restart_on_the_same_boot_reports_only_newer_records(tmp_path: Path) -> None:
    dev = FakeKmsg(BUFFER)
    await follow(dev, KmsgPosition(tmp_path, "boot-a"), 2)
    dev.log(rec(6, xid(95)))  # while the agent is down
    src, xids = await follow(dev, KmsgPosition(tmp_path, "boot-a"), 1)
    dev.close()
    assert xids == [95]
    assert src.counters.value(KMSG_SKIPPED) == 4  # records 1-4 (the position is the last XID)
    assert src.counters.value(KMSG_REPLAYED) == 1


async def test_a_new_boot_replays_everything(tmp_path: Path) -> None:
    dev = FakeKmsg(BUFFER)
    await follow(dev, KmsgPosition(tmp_path, "boot-a"), 2)
    rebooted = FakeKmsg([rec(0, "Linux version 6.1.0"), rec(1, xid(79))])
    src, xids = await follow(rebooted, KmsgPosition(tmp_path, "boot-b"), 1)
    dev.close()
    rebooted.close()
    assert xids == [79]
    assert src.counters.value(KMSG_SKIPPED) == 0
    assert saved_seq(tmp_path, "boot-b") == 1
    assert saved_seq(tmp_path, "boot-a") is None  # the file now belongs to boot-b


async def test_an_unreadable_position_replays_everything(tmp_path: Path) -> None:
    StateStore(tmp_path).put_boot_value(NAME, "boot-a", b"{not json")
    dev = FakeKmsg(BUFFER)
    _, xids = await follow(dev, KmsgPosition(tmp_path, "boot-a"), 2)
    dev.close()
    assert xids == [79, 48]


def test_the_position_only_moves_forward(tmp_path: Path) -> None:
    pos = KmsgPosition(tmp_path, "b")
    pos.save(10)
    pos.save(7)
    assert saved_seq(tmp_path, "b") == 10


def test_a_position_that_cannot_be_saved_is_not_fatal(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    pos = KmsgPosition(store, "b")
    store.close()  # every statement fails now
    pos.save(3)  # logged, not raised
    assert store.write_errors >= 1


@pytest.mark.parametrize(
    ("line", "seq"),
    [
        ("6,1234,5678901,-;NVRM: Xid (PCI:0000:1b:00): 79", 1234),
        ("4,1235,5678955,-,caller=T2831;NVRM: Xid (PCI:0000:01:00): 79", 1235),
        ("3,88211,219470994,c,caller=C12;x", 88211),
        ("[ 12.3] NVRM: Xid (PCI:0000:1b:00): 79", None),
        ("Nov 22 18:29:55 host kernel: NVRM: Xid", None),
        ("6,x,1,-;y", None),
        ("", None),
    ],
)
def test_record_seq(line: str, seq: int | None) -> None:
    assert record_seq(line) == seq


@pytest.mark.parametrize(
    ("line", "time_us"),
    [
        ("6,1234,5678901,-;NVRM: Xid (PCI:0000:1b:00): 79", 5678901),
        ("4,1235,0,-,caller=T2831;x", 0),
        ("3,88211,219470994123,c,caller=C12;x", 219470994123),
        ("6,1,-5,-;x", None),
        ("6,1,1.5,-;x", None),
        ("[ 12.3] NVRM: Xid (PCI:0000:1b:00): 79", None),
        ("Nov 22 18:29:55 host kernel: NVRM: Xid", None),
        ("", None),
    ],
)
def test_record_time_us(line: str, time_us: int | None) -> None:
    assert record_time_us(line) == time_us


NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("time_us", "monotonic_s", "expected"),
    [
        (1_000_000, 1.0, NOW),  # logged just now
        (5_678_901, 3605.678901, NOW - timedelta(hours=1)),
        (0, 86400.0, NOW - timedelta(days=1)),  # at boot, a day ago
        (1_500_000, 2.0, NOW - timedelta(seconds=0.5)),
        (9_000_000, 8.0, NOW),  # stamped "later" than now (clock skew): never the future
    ],
)
def test_record_wall_time(time_us: int, monotonic_s: float, expected: datetime) -> None:
    assert record_wall_time(time_us, NOW, monotonic_s) == expected


async def test_replayed_xids_carry_the_time_they_were_logged(tmp_path: Path) -> None:
    """A replayed record is dated by its own stamp (boot = now - CLOCK_MONOTONIC); a record
    logged after start is dated when read."""
    clock = FakeClock(NOW, monotonic_start=7200.0)  # booted two hours ago
    logged = [
        b"4,10,60000000,-;" + xid(79).encode() + b"\n",  # one minute after boot
        b"4,11,5400250000,-,caller=T7;" + xid(48).encode() + b"\n",  # 90 min after boot
    ]
    live = b"4,12,7100000000,-;" + xid(62).encode() + b"\n"  # its stamp is ignored
    dev = FakeKmsg(logged)
    src, obs = await follow_obs(dev, KmsgPosition(tmp_path, "b"), 3, then=live, clock=clock)
    dev.close()
    assert [(o.xid, o.at) for o in obs] == [
        (79, NOW - timedelta(seconds=7140)),
        (48, NOW - timedelta(seconds=1799.75)),
        (62, NOW),
    ]
    assert src.counters.value(KMSG_REPLAYED) == 2


async def test_a_record_handed_on_before_a_crash_is_redelivered_once(tmp_path: Path) -> None:
    """The run died after handing record 4 on and before saving it: the next run reads it as
    a redelivery (the engine counts it once), record 6 as new."""
    dev = FakeKmsg([*BUFFER, rec(6, xid(62))])
    pos = KmsgPosition(tmp_path, "boot-a")
    pos.save(2)
    pos.handling(4, rec(4, xid(48), caller=",caller=C3").decode().rstrip("\n"))
    src, obs = await follow_obs(dev, KmsgPosition(tmp_path, "boot-a"), 2)
    dev.close()
    assert [(o.xid, o.redelivered) for o in obs] == [(48, True), (62, False)]
    assert src.counters.value(KMSG_REDELIVERED) == 1 and src.counters.value(KMSG_XIDS) == 1
    saved = KmsgPosition(tmp_path, "boot-a").load()
    assert saved is not None and (saved.seq, saved.handed) == (6, ())


async def test_restarts_while_records_arrive_report_each_record_once(tmp_path: Path) -> None:
    """Five runs of the follower on one boot; between them, and while each runs, the kernel
    logs more XIDs: every one is reported exactly once."""
    dev = FakeKmsg(list(BUFFER))
    seq = 6
    seen: list[int] = []
    for run in range(5):
        dev.log(rec(seq, xid(100 + seq)))  # while the agent is down
        seq += 1
        _, obs = await follow_obs(
            dev, KmsgPosition(tmp_path, "boot-a"), 2 + (run == 0) * 2, then=rec(seq, xid(100 + seq))
        )
        seq += 1
        seen += [o.xid for o in obs]
    dev.close()
    assert seen == [79, 48] + [100 + s for s in range(6, seq)]


async def test_a_replayed_xid_before_the_inventory_keeps_its_position_until_applied(
    tmp_path: Path,
) -> None:
    """NVML's first inventory comes after the replay (slow without persistence mode): the XID
    waits in the engine, and the position moves past it only once the engine applied it; a
    run stopped before that reads it again."""
    engine = HealthEngine(HealthSettings(), FakeClock())
    inventory = Inventory(
        source="nvml", gpus=(GpuIdentity(index=0, uuid=UUID, model="H100", pci_bus_id=PCI),)
    )

    def driver(obs: Observation) -> None:  # as the engine driver: apply, then confirm
        engine.observe(obs)
        for taken in engine.taken():
            assert taken.on_taken is not None
            taken.on_taken()

    dev = FakeKmsg([rec(1, "Linux version 6.1.0"), rec(2, xid(79))])
    src = KmsgSource(
        "/dev/kmsg",
        KmsgSettings(select_timeout_s=0.05),
        FakeClock(),
        position=KmsgPosition(tmp_path, "boot-a"),
        open_device=dev.open,
    )
    task = asyncio.create_task(src.run(driver))
    try:
        await until(lambda: engine.counters.value(HELD_XIDS) == 1, "the replayed XID held")
        assert saved_seq(tmp_path, "boot-a") is None  # not applied: not handled
        # a restart now (before the inventory) reads it again: nothing is lost
        _, again = await follow(dev, KmsgPosition(tmp_path, "boot-a"), 1)
        assert again == [79]
        driver(inventory)
        assert engine.xid_counts() == {(UUID, 79): 1}
        assert saved_seq(tmp_path, "boot-a") == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        dev.close()


def sxid(code: int) -> str:
    return f"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): {code}, Non-fatal, Link 48 egress error"


@pytest.mark.parametrize("sxids", [False, True], ids=["xids", "xids-and-sxids"])
@pytest.mark.parametrize("held", [0, 3], ids=["taken-at-once", "held-until-the-third"])
async def test_a_crash_after_any_write_counts_no_record_twice(
    tmp_path: Path, held: int, sxids: bool
) -> None:
    """/dev/kmsg's form of the followed file's test: the store as it is after each of the first
    run's writes is every state a SIGKILL can leave. The next run from there hands on every
    record the first did not have taken (the engine's held XIDs die with the process), and
    none that the first had handed on as a fresh one again (it may come back as a
    redelivery). ``held``: the engine holds the first XIDs and takes them
    together with the ``held``-th; ``sxids``: NVSwitch SXid records between them, handled once
    the sink returned (never held)."""
    codes = [79, 48, 62, 64, 74, 94, 95]
    records: list[bytes] = []
    seq = 0
    for n, code in enumerate(codes):
        seq += 1
        records.append(rec(seq, xid(code)))
        seq += 1
        records.append(rec(seq, "eth0: link up"))
        if sxids and n % 2 == 0:
            seq += 1
            records.append(rec(seq, sxid(12000 + code)))
    keys = [f"x{c}" for c in codes] + ([f"s{12000 + c}" for c in codes[::2]] if sxids else [])

    def key(obs: Observation) -> str | None:
        if isinstance(obs, XidObservation):
            return f"x{obs.xid}"
        if isinstance(obs, SxidObservation):
            return f"s{obs.sxid}"
        return None

    store = StateStore(tmp_path / "first")
    writes = WriteLog(store)
    waiting: list[XidObservation] = []

    def engine(obs: Observation) -> None:
        k = key(obs)
        if k is None:
            return
        writes.note("handed", k)
        if not isinstance(obs, XidObservation):
            writes.note("taken", k)  # an SXid: taken when the sink returns
            return
        waiting.append(obs)
        if len(waiting) >= held:
            for o in waiting:
                assert o.on_taken is not None
                writes.note("taken", key(o))
                o.on_taken()
            waiting.clear()

    dev = FakeKmsg(records)
    src = KmsgSource(
        "/dev/kmsg",
        KmsgSettings(select_timeout_s=0.05),
        FakeClock(),
        position=KmsgPosition(store, "boot-a"),
        open_device=dev.open,
    )
    task = asyncio.create_task(src.run(engine))
    try:
        await until(lambda: writes.count("handed") == len(keys), "every record")
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    crashes = list(writes.crashes())
    assert len(crashes) >= len(codes)
    for crash in crashes:
        before, taken = crash.handed, crash.taken
        state = crash.restore(tmp_path / f"crash-{crash.n}", NAME, "boot-a")
        out = await _rerun(dev, state, {k for k in keys if k not in taken}, key)
        fresh = [key(o) for o in out if key(o) and not getattr(o, "redelivered", False)]
        assert not before & set(fresh), (crash.n, before, fresh)
        assert len(fresh) == len(set(fresh))
    dev.close()


async def _rerun(
    dev: FakeKmsg, state: Path, due: set[str], key: Callable[[Observation], str | None]
) -> list[Observation]:
    """A run of the follower from ``state``, until every record in ``due`` came (and a
    moment for one too many)."""
    out: list[Observation] = []
    src = KmsgSource(
        "/dev/kmsg",
        KmsgSettings(select_timeout_s=0.05),
        FakeClock(),
        position=KmsgPosition(state, "boot-a"),
        open_device=dev.open,
    )
    task = asyncio.create_task(src.run(taking(out)))
    try:
        await until(lambda: {key(o) for o in out} >= due, f"{sorted(due)} from {state.name}")
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return out
