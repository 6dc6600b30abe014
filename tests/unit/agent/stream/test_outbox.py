"""The durable outbox: order, bounds, drop policy, restart replay, the state store under it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuhealth.agent.state_store import DB_NAME
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import OutboxSettings
from gpuhealth.protocol import Event, Heartbeat, Snapshot, decode

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def ev(seq: int, uuid: str = "GPU-1") -> Event:
    return Event(
        seq=seq,
        node="n",
        at=AT,
        kind="transition",
        gpu_uuid=uuid,
        gpu_index=0,
        previous="healthy",
        current="unhealthy",
    )


def hb(seq: int) -> Heartbeat:
    return Heartbeat(seq=seq, node="n", at=AT)


def snap(seq: int) -> Snapshot:
    return Snapshot(seq=seq, node="n", taken_at=AT)


def kinds(box: Outbox) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in box.entries()]


def test_sequence_numbers_and_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    assert box.first_unacked_seq() == 1
    for make in (ev, hb, ev):
        box.append(make)
    assert kinds(box) == [(1, "event"), (2, "heartbeat"), (3, "event")]
    assert [decode(e.frame).seq for e in box.entries()] == [1, 2, 3]  # type: ignore[union-attr]
    assert box.next_after(1) is not None and box.next_after(1).seq == 2  # type: ignore[union-attr]
    assert box.next_after(3) is None
    assert box.count_through(2) == 2


def test_ack_prunes_cumulatively_and_survives_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for _ in range(5):
        box.append(ev)
    assert box.ack(3) == 3
    assert box.ack(2) == 0
    assert [e.seq for e in box.entries()] == [4, 5]
    sid = box.stream_id
    box.close()
    again = Outbox(tmp_path)
    assert again.stream_id == sid
    assert [e.seq for e in again.entries()] == [4, 5]
    assert again.acked == 3
    assert again.append(ev).seq == 6


def test_restart_replays_unacked_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    frames = [box.append(m).frame for m in (ev, hb, ev, snap, ev)]
    box.close()
    again = Outbox(tmp_path)
    assert [e.frame for e in again.entries()] == frames
    assert again.metrics.outbox_messages == 5


def test_full_drops_oldest_heartbeats_first_never_events(tmp_path: Path) -> None:
    metrics = StreamMetrics()
    box = Outbox(tmp_path, OutboxSettings(max_messages=4), metrics)
    box.append(hb)  # 1
    box.append(ev)  # 2
    box.append(hb)  # 3
    box.append(ev)  # 4
    box.append(ev)  # 5 -> drops heartbeat 1
    assert kinds(box) == [(2, "event"), (3, "heartbeat"), (4, "event"), (5, "event")]
    box.append(ev)  # 6 -> drops heartbeat 3
    box.append(ev)  # 7 -> nothing droppable: events exceed the bound
    assert [k for _, k in kinds(box)] == ["event"] * 5
    assert metrics.dropped["heartbeat"] == 2
    assert metrics.dropped["event"] == 0
    box.close()
    assert [e.seq for e in Outbox(tmp_path).entries()] == [2, 4, 5, 6, 7]


def test_byte_bound(tmp_path: Path) -> None:
    size = len(Outbox(tmp_path / "probe").append(hb).frame)
    box = Outbox(tmp_path / "b", OutboxSettings(max_bytes=size * 3))
    for _ in range(10):
        box.append(hb)
    assert len(box) == 3 and box.size_bytes <= size * 3
    assert [e.seq for e in box.entries()] == [8, 9, 10]


def test_new_snapshot_supersedes_pending_snapshot(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(snap)
    box.append(ev)
    box.append(snap)
    assert kinds(box) == [(2, "event"), (3, "snapshot")]
    assert box.metrics.dropped["snapshot"] == 0


def test_a_damaged_store_is_moved_aside_and_counted(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    box = Outbox(tmp_path)
    assert len(box) == 0 and box.metrics.corrupt_records == 1
    assert box.append(ev).seq == 1
    assert any(p.name.startswith(f"{DB_NAME}.corrupt-") for p in tmp_path.iterdir())


def test_acked_messages_leave_the_store(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for _ in range(30):
        box.append(hb)
        box.ack(box.next_seq - 1)
    box.append(ev)
    assert [seq for seq, _, _ in box.store.outbox_rows()] == [31]
    box.close()
    again = Outbox(tmp_path)
    assert [e.seq for e in again.entries()] == [31]
    assert again.next_seq == 32


def test_sequence_never_reused_after_dropping_everything(tmp_path: Path) -> None:
    box = Outbox(tmp_path, OutboxSettings(max_messages=1))
    for _ in range(5):
        box.append(hb)
    box.ack(5)
    box.close()
    assert Outbox(tmp_path).next_seq == 6


def test_ack_beyond_assigned_moves_next_seq(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(ev)
    box.ack(100)
    assert len(box) == 0
    assert box.append(ev).seq == 101


def test_listener_called_on_append(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    calls: list[int] = []
    box.listener = lambda: calls.append(1)
    box.append(ev)
    assert calls == [1]


def test_write_failure_keeps_message_in_memory_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(hb)
    # the disk is full: SQLite may not grow the database by one page more
    db = box.store._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    while box.metrics.outbox_write_errors == 0 and len(box) < 10_000:
        last = box.append(ev)
    assert box.metrics.outbox_write_errors == 1
    assert box.entries()[-1] == last  # kept in memory, still sent while connected
    stored = [seq for seq, _, _ in box.store.outbox_rows()]
    assert stored == list(range(1, last.seq))  # the failed one rolled back, nothing torn
    db.execute("PRAGMA max_page_count = 1073741823")
    box.ack(last.seq)
    assert len(box) == 0 and box.store.outbox_rows() == []


def test_collector_exports_the_documented_names() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuhealth.agent.stream.metrics import StreamCollector

    m = StreamMetrics(connected=True, outbox_messages=3, corrupt_records=1)
    m.dropped["heartbeat"] = 4
    reg = CollectorRegistry()
    reg.register(StreamCollector(m))
    text = generate_latest(reg).decode()
    for line in (
        "gpuhealth_agent_stream_connected 1.0",
        "gpuhealth_agent_outbox_messages 3.0",
        'gpuhealth_agent_outbox_dropped_total{kind="heartbeat"} 4.0',
        "gpuhealth_agent_outbox_corrupt_records_total 1.0",
        "gpuhealth_agent_outbox_write_errors_total 0.0",
    ):
        assert line in text
    docs = (Path(__file__).resolve().parents[4] / "docs" / "metrics.md").read_text()
    for name in ("outbox_corrupt_records_total", "outbox_write_errors_total"):
        assert f"gpuhealth_agent_{name}" in docs


def test_state_dir_is_locked_while_open(tmp_path: Path) -> None:
    from gpuhealth.common.errors import ConfigError

    box = Outbox(tmp_path)
    with pytest.raises(ConfigError, match="in use"):
        Outbox(tmp_path)
    box.close()
    box.close()
    Outbox(tmp_path).close()
