"""The per-connection state machine without sockets: decode, order, dedupe, deliver, ack."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.controller.stream.metrics import StreamServerMetrics
from gpuhealth.controller.stream.session import SeqTracker, Session, TokenBucket, check_seq
from gpuhealth.protocol import Ack, ErrorCode
from tests.support.protocol import hello as make_hello
from tests.support.stream import RecordingSink, event_frame, hello_frame


def make(
    seq: int = 1, stream: str = "s1", tracker: SeqTracker | None = None, burst: float = 100.0
) -> tuple[Session, RecordingSink, SeqTracker]:
    sink = RecordingSink()
    tracker = tracker or SeqTracker()
    hello = make_hello("node-a", 0, seq=seq, stream_id=stream)
    bucket = TokenBucket(rate_per_s=0.0, burst=burst, now=0.0)
    return Session(hello, sink, tracker, StreamServerMetrics(), bucket), sink, tracker


def test_delivers_in_order_and_acks_each() -> None:
    s, sink, tracker = make()
    for seq in (1, 2, 5):
        assert s.on_frame(event_frame(seq), 0.0).ack == Ack(seq=seq)
    assert [m.seq for _, m in sink.messages] == [1, 2, 5]
    assert tracker.applied("node-a", "s1") == 5


def test_replay_on_new_connection_is_acked_not_redelivered() -> None:
    s, _, tracker = make()
    for seq in (1, 2, 3):
        s.on_frame(event_frame(seq), 0.0)
    s2, sink2, _ = make(seq=2, tracker=tracker)
    replies = [s2.on_frame(event_frame(seq), 0.0) for seq in (2, 3, 4)]
    assert [r.ack for r in replies] == [Ack(seq=2), Ack(seq=3), Ack(seq=4)]
    assert [m.seq for _, m in sink2.messages] == [4]


def test_a_new_stream_id_starts_over() -> None:
    s, _, tracker = make()
    s.on_frame(event_frame(7), 0.0)
    s2, sink2, _ = make(stream="s2", tracker=tracker)
    s2.on_frame(event_frame(1), 0.0)
    assert [m.seq for _, m in sink2.messages] == [1]


def test_errors() -> None:
    cases = [
        ([event_frame(1), event_frame(1)], ErrorCode.OUT_OF_ORDER),
        ([event_frame(3), event_frame(2)], ErrorCode.OUT_OF_ORDER),
        ([hello_frame()], ErrorCode.OUT_OF_ORDER),
        ([b"\xc1garbage"], ErrorCode.MALFORMED),
        ([event_frame(1)[:-3]], ErrorCode.MALFORMED),
        ([event_frame(1, node="node-b")], ErrorCode.FORBIDDEN),
    ]
    for frames, code in cases:
        s, _, _ = make()
        replies = [s.on_frame(f, 0.0) for f in frames]
        assert replies[-1].error is not None and replies[-1].error.code == code, frames
        assert all(r.error is None for r in replies[:-1])


def test_below_hello_seq_is_out_of_order() -> None:
    s, _, _ = make(seq=10)
    assert s.on_frame(event_frame(9), 0.0).error is not None


def test_rate_limit() -> None:
    s, _, _ = make(burst=3)
    replies = [s.on_frame(event_frame(i), 0.0) for i in range(1, 5)]
    assert [r.error.code if r.error else None for r in replies] == [
        None,
        None,
        None,
        ErrorCode.RATE_LIMITED,
    ]


def test_replaced_session_stops_delivering() -> None:
    s, sink, _ = make()
    s.replaced = True
    r = s.on_frame(event_frame(1), 0.0)
    assert r.ack is None and r.error is None and sink.messages == []


def test_server_collector_names() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuhealth.controller.stream.metrics import StreamServerCollector

    m = StreamServerMetrics()
    m.messages["event"] = 2
    m.rejected["node_mismatch"] = 1
    m.errors["malformed"] = 3
    reg = CollectorRegistry()
    reg.register(StreamServerCollector(m))
    text = generate_latest(reg).decode()
    assert 'gpuhealth_stream_messages_total{type="event"} 2.0' in text
    assert 'gpuhealth_stream_rejected_total{reason="node_mismatch"} 1.0' in text
    assert 'gpuhealth_stream_errors_total{code="malformed"} 3.0' in text


def test_heartbeats_acked_every_nth_events_at_once() -> None:
    from gpuhealth.protocol import encode
    from tests.support.stream import AT

    def hb(seq: int) -> bytes:
        from gpuhealth.protocol import Heartbeat

        return encode(Heartbeat(seq=seq, node="node-a", at=AT))

    sink = RecordingSink()
    hello = make_hello("node-a", 0, seq=1, stream_id="s")
    s = Session(
        hello,
        sink,
        SeqTracker(),
        StreamServerMetrics(),
        TokenBucket(0.0, 100.0, 0.0),
        heartbeat_ack_every=3,
    )
    frames = [hb(1), hb(2), hb(3), hb(4), event_frame(5), hb(6)]
    acks = [r.ack.seq if r.ack else None for r in (s.on_frame(f, 0.0) for f in frames)]
    assert acks == [None, None, 3, None, 5, None]
    assert [m.seq for _, m in sink.messages] == [1, 2, 3, 4, 5, 6]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=64) | st.sampled_from([event_frame(2), hello_frame()]), max_size=5)
)
def test_any_frames_get_a_reply_never_an_exception(frames: list[bytes]) -> None:
    s, sink, _ = make()
    for f in frames:
        reply = s.on_frame(f, 0.0)
        assert (reply.ack is None) or (reply.error is None)
        if reply.error is not None:
            break
    assert all(m.node == "node-a" for _, m in sink.messages)


@pytest.mark.parametrize(
    ("seq", "last", "applied", "verdict"),
    [
        (5, 4, 0, "deliver"),
        (10, 4, 0, "deliver"),  # forward gap: dropped heartbeats
        (5, 4, 5, "duplicate"),  # replay after reconnect
        (3, 0, 7, "duplicate"),
        (8, 0, 7, "deliver"),
        (4, 4, 0, "out_of_order"),  # repeated on the same connection
        (3, 4, 9, "out_of_order"),  # backwards on the same connection
    ],
)
def test_check_seq(seq: int, last: int, applied: int, verdict: str) -> None:
    assert check_seq(seq, last, applied) == verdict


def test_seq_tracker_per_node_stream() -> None:
    t = SeqTracker()
    t.record("a", "s1", 5)
    assert t.applied("a", "s1") == 5
    assert t.applied("a", "s2") == 0
    assert t.applied("b", "s1") == 0
    t.record("a", "s2", 1)  # a new stream (state dir wiped) replaces the old one
    assert t.applied("a", "s1") == 0
    assert len(t) == 1
