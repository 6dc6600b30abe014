from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuhealth.controller.incidents import IncidentBook, Subjects, incident_id

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def _open(book: IncidentBook, now: datetime, nodes: int = 2) -> None:
    book.open(
        "job",
        "ml/Job/train/xid-app",
        subjects=Subjects(nodes=tuple(f"n{i}" for i in range(nodes)), owner="ml/Job/train"),
        decision="no taint",
        reason="XID 13 on 2 nodes of one job",
        now=now,
        evidence={"nodes": nodes},
        xid_class="app",
    )


def test_same_key_is_one_incident_and_keeps_opened_at() -> None:
    book = IncidentBook()
    seen: list[tuple[str, str]] = []
    book.subscribe(lambda change, inc: seen.append((change, inc.id)))
    _open(book, T0)
    _open(book, T0 + timedelta(seconds=5))  # same content: no update heard
    _open(book, T0 + timedelta(seconds=9), nodes=3)
    [inc] = book.list()
    assert inc.id == incident_id("job", "ml/Job/train/xid-app")
    assert inc.opened_at == T0 and inc.last_seen == T0 + timedelta(seconds=9)
    assert inc.evidence == {"nodes": 3}
    assert [c for c, _ in seen] == ["opened", "updated"]
    assert book.opened_total["job"] == 1
    assert book.counts() == {
        "job": 1,
        "gpu": 0,
        "domain": 0,
        "unwatched": 0,
        "override": 0,
        "capability": 0,
    }


def test_close_keeps_bounded_history_and_reopen_is_new() -> None:
    book = IncidentBook(closed_keep=1)
    _open(book, T0)
    iid = book.list()[0].id
    closed = book.close(iid, T0 + timedelta(minutes=1), reason="quiet")
    assert closed is not None and closed.state == "closed" and closed.close_reason == "quiet"
    assert closed.reason == "XID 13 on 2 nodes of one job"  # why it opened: kept
    assert book.list() == [] and len(book.list(include_closed=True)) == 1
    assert book.close(iid, T0) is None
    _open(book, T0 + timedelta(minutes=2))
    reopened = book.find("job", "ml/Job/train/xid-app")
    assert reopened is not None and reopened.opened_at == T0 + timedelta(minutes=2)
    assert book.opened_total["job"] == 2
    d = reopened.to_dict()
    assert d["kind"] == "job" and d["subjects"]["owner"] == "ml/Job/train"
    assert d["openedAt"].endswith("Z")


def test_listener_error_does_not_break_the_book() -> None:
    book = IncidentBook()

    def bad(change: str, inc: object) -> None:
        raise RuntimeError("boom")

    book.subscribe(bad)
    _open(book, T0)
    assert len(book) == 1
