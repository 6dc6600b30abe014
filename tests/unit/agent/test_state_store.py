"""The agent's one state store: related writes commit together (also when the process is
killed between them), nested transactions join the outer one, per-boot documents."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuhealth.agent.sources.kmsg.source import KmsgPosition
from gpuhealth.agent.state_store import LatchedStore, StateStore
from gpuhealth.agent.stream.outbox import Outbox
from tests.support.agent import XID79, uuid
from tests.support.clock import FakeClock
from tests.support.wait import until

CHILD = """
import os, signal, sys
from datetime import UTC, datetime
from gpuhealth.agent.sources.kmsg.source import KmsgPosition
from gpuhealth.agent.state_store import LatchedStore, StateStore
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.protocol import Event

store = StateStore(sys.argv[1])
outbox, position = Outbox(store), KmsgPosition(store, "boot-1")
latched = LatchedStore(store, "boot-1")
event = lambda seq: Event(
    seq=seq, node="n", at=datetime.now(UTC), kind="xid", gpu_uuid="GPU-1", gpu_index=0,
    previous="healthy", current="unhealthy", xid=79,
)
with store.transaction():  # as the engine driver handles one kernel-log XID
    outbox.append(event)
    latched.save({"GPU-1": []})
    if sys.argv[2] == "inside":
        os.kill(os.getpid(), signal.SIGKILL)
    position.save(17)
if sys.argv[2] == "after":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _run_killed(state: Path, where: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(state), where],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


@pytest.mark.parametrize(("where", "committed"), [("inside", False), ("after", True)])
def test_a_process_killed_between_related_writes_leaves_both_or_neither(
    tmp_path: Path, where: str, committed: bool
) -> None:
    _run_killed(tmp_path, where)
    store = StateStore(tmp_path)
    outbox = Outbox(store)
    saved = KmsgPosition(store, "boot-1").load()
    latched = LatchedStore(store, "boot-1").load()
    got = (len(outbox), saved is not None and saved.seq == 17, latched == {"GPU-1": []})
    assert got == ((1, True, True) if committed else (0, False, False))
    # the sequence number of a message that never committed is free again; one that did
    # is never reused
    assert outbox.next_seq == (2 if committed else 1)


def test_nested_transactions_commit_once_at_the_outermost(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    other = StateStore(tmp_path)  # a second connection sees only what was committed
    with store.transaction():
        store.put_boot_value("a", "b", b"1")
        with store.transaction():
            store.put_boot_value("c", "b", b"2")
        assert other.boot_value("a", "b") == (None, False)
    assert other.boot_value("a", "b") == (b"1", False)
    assert other.boot_value("c", "b") == (b"2", False)


def test_an_exception_rolls_the_whole_transaction_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with pytest.raises(RuntimeError), store.transaction():
        store.put_boot_value("a", "b", b"1")
        raise RuntimeError("the engine failed")
    assert store.boot_value("a", "b") == (None, False)
    assert store.put_boot_value("a", "b", b"2")  # the store goes on
    assert store.boot_value("a", "b") == (b"2", False)


def test_a_document_of_another_boot_is_not_read(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    LatchedStore(store, "boot-1").save({uuid(0): [XID79]})
    assert LatchedStore(store, "boot-2").load() == {}
    assert store.boot_value("latched", "boot-2") == (None, True)


def test_the_store_runs_in_wal_mode_and_durable_by_default(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    relaxed = StateStore(tmp_path / "r", durable=False)
    assert relaxed._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_latched_store_round_trip_and_reboot(tmp_path: Path) -> None:
    store = LatchedStore(tmp_path, boot_id="boot-1")
    assert store.load() == {}
    store.save({uuid(0): [XID79]})
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {uuid(0): [XID79]}
    assert LatchedStore(tmp_path, boot_id="boot-2").load() == {}
    StateStore(tmp_path).put_boot_value("latched", "boot-1", b"{not json")
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {}


async def test_the_log_is_checkpointed_by_the_background_task(tmp_path: Path) -> None:
    """The agent's store never checkpoints in a commit (on the event loop): its task does, in a
    worker thread, on a connection of its own."""
    store = StateStore(tmp_path, background_checkpoint=True)
    assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    for i in range(200):
        store.put_boot_value(f"k{i}", "b", b"x" * 4000)
    wal = tmp_path / "state.db-wal"
    assert wal.stat().st_size > 200 * 4000  # every page still in the log
    clock = FakeClock()
    task = asyncio.create_task(store.checkpoint_loop(clock, 30.0))
    await clock.advance_and_settle(0.0)
    await clock.advance_and_settle(30.0)
    await until(lambda: store.checkpoints == 1, "the first checkpoint")
    task.cancel()
    frames, copied = store.checkpoint()
    assert frames == copied > 0  # the whole log is in the database
    assert StateStore(tmp_path).boot_value("k199", "b") == (b"x" * 4000, False)


def test_what_a_failed_transaction_held_is_written_by_the_next_save(tmp_path: Path) -> None:
    """Disk full in the middle of one observation's transaction: everything it held rolls back
    together (not the latched verdict without its Event), and the next save writes it."""
    from tests.unit.agent.stream.test_outbox import ev

    store = StateStore(tmp_path)
    latched, outbox = LatchedStore(store, "b"), Outbox(store)
    db = store._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    with store.transaction():
        latched.save({uuid(0): [XID79]})
        while outbox.metrics.outbox_write_errors == 0 and len(outbox) < 10_000:
            outbox.append(ev)
    assert outbox.metrics.outbox_write_errors == 1
    assert LatchedStore(StateStore(tmp_path), "b").load() == {}  # rolled back with the Events
    assert store.outbox_rows() == []
    db.execute("PRAGMA max_page_count = 1073741823")
    latched.save({uuid(0): [XID79]})  # the same set: written again all the same
    assert LatchedStore(StateStore(tmp_path), "b").load() == {uuid(0): [XID79]}
