"""The report book (controller/remediation/action_reports.py): a report is kept only under the node
whose stream brought it, and one node's reports can never push out another node's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuhealth.controller.remediation.action_reports import MAX_REPORTS_PER_NODE, ReportBook
from gpuhealth.controller.stream.metrics import StreamServerMetrics
from gpuhealth.controller.stream.session import SeqTracker, Session, TokenBucket
from gpuhealth.protocol import ErrorCode, Hello
from gpuhealth.protocol.remediation import ActionReport, ReportState
from tests.support.stream import RecordingSink

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def report(
    node: str, order_id: str, state: ReportState = "succeeded", *, seq: int = 1, at_s: float = 0
) -> ActionReport:
    return ActionReport(
        seq=seq,
        node=node,
        order_id=order_id,
        episode=f"{node}-ep",
        action="reset-gpu",
        state=state,
        at=T0 + timedelta(seconds=at_s),
    )


def test_a_report_is_kept_under_its_streams_node_only() -> None:
    book = ReportBook()
    assert not book.record("node-a", report("node-b", "fp-reset-gpu-1"))
    assert book.latest("node-b", "fp-reset-gpu-1") is None
    assert book.latest("node-a", "fp-reset-gpu-1") is None


def test_a_flood_of_reports_from_one_node_never_evicts_another_nodes() -> None:
    book = ReportBook()
    kept = report("node-b", "fp-reset-gpu-1")
    assert book.record("node-b", kept)
    # node-a's agent (authenticated, compromised) reports on order ids it was never sent
    for i in range(10_000):
        book.record("node-a", report("node-a", f"forged-{i}", seq=i + 1))
    assert book.latest("node-b", "fp-reset-gpu-1") == kept
    assert len(book) <= MAX_REPORTS_PER_NODE + 1
    # its own newest reports are still there
    assert book.latest("node-a", "forged-9999") is not None


def test_an_older_report_never_replaces_a_newer_one() -> None:
    book = ReportBook()
    assert book.record("node-a", report("node-a", "o-1", "succeeded", seq=5, at_s=10))
    assert not book.record("node-a", report("node-a", "o-1", "running", seq=3, at_s=5))
    latest = book.latest("node-a", "o-1")
    assert latest is not None and latest.state == "succeeded"


def test_the_stream_refuses_a_report_naming_another_node() -> None:
    got: list[tuple[str, ActionReport]] = []
    hello = Hello(node="node-a", stream_id="s", seq=1, boot_id="b", agent_version="t")
    session = Session(
        hello,
        RecordingSink(),
        SeqTracker(),
        StreamServerMetrics(),
        TokenBucket(100.0, 100, 0.0),
        reports=lambda node, r: got.append((node, r)),
    )
    reply = session.on_message(report("node-b", "fp-reset-gpu-1", seq=1))
    assert reply.error is not None and reply.error.code is ErrorCode.FORBIDDEN
    assert got == []
