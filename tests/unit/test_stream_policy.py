"""Pure pieces of the stream: backoff, token file, rate limit, auth policy, sequence rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuhealth.agent.stream.backoff import Backoff, backoff_delay
from gpuhealth.agent.stream.settings import BackoffSettings
from gpuhealth.agent.stream.token import TokenFile
from gpuhealth.common.clock import FakeClock
from gpuhealth.common.errors import TransientError
from gpuhealth.controller.stream.auth import (
    NODE_NAME_KEY,
    CachingAuthenticator,
    Identity,
    StaticAuthenticator,
    bearer_token,
    decide,
    service_account_username,
)
from gpuhealth.controller.stream.limits import TokenBucket
from gpuhealth.controller.stream.session import SeqTracker, check_seq
from gpuhealth.protocol import ErrorCode

S = BackoffSettings(initial_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.5, 1.0),
        (2, 0.5, 2.0),
        (3, 0.5, 4.0),
        (5, 0.5, 10.0),
        (50, 0.5, 10.0),
        (1, 0.0, 0.5),
        (1, 0.999999, 1.5),
        (4, 0.0, 4.0),
    ],
)
def test_backoff_delay(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(S, attempt, lambda: rand) == pytest.approx(expected, rel=1e-5)


def test_backoff_counts_and_resets() -> None:
    b = Backoff(S, lambda: 0.5)
    assert [b.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    b.reset()
    assert b.next_delay() == 1.0


def test_token_file_rereads_on_rotation(tmp_path: Path) -> None:
    p = tmp_path / "token"
    p.write_text("one\n")
    tf = TokenFile(p)
    assert tf.get() == "one"
    assert tf.get() == "one"
    assert tf.reads == 1
    tmp = tmp_path / "token.new"
    tmp.write_text("two-rotated")
    os.replace(tmp, p)  # the kubelet swaps atomically
    assert tf.get() == "two-rotated"
    assert tf.reads == 2
    p.write_text("")
    with pytest.raises(TransientError):
        tf.get()
    p.unlink()
    with pytest.raises(TransientError):
        tf.get()


def test_token_bucket() -> None:
    b = TokenBucket(rate_per_s=2.0, burst=3.0, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.5) is True  # refilled one token
    assert b.take(0.5) is False
    assert [b.take(100.0) for _ in range(4)] == [True, True, True, False]  # capped at burst


AGENT = service_account_username("gpuhealth", "gpuhealth-agent")


def ident(user: str = AGENT, node: str | None = "node-a", **kw: object) -> Identity:
    extra = {NODE_NAME_KEY: (node,)} if node is not None else {}
    kw.setdefault("audiences", ("gpuhealth",))
    return Identity(authenticated=True, username=user, extra=extra, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("identity", "claimed", "ok", "reason", "code"),
    [
        (ident(), "node-a", True, "accepted", None),
        (None, "node-a", False, "missing_token", ErrorCode.UNAUTHENTICATED),
        (
            Identity(authenticated=False),
            "node-a",
            False,
            "unauthenticated",
            ErrorCode.UNAUTHENTICATED,
        ),
        (ident(audiences=("other",)), "node-a", False, "wrong_audience", ErrorCode.UNAUTHENTICATED),
        (ident(audiences=("gpuhealth",)), "node-a", True, "accepted", None),
        (ident(audiences=()), "node-a", False, "wrong_audience", ErrorCode.UNAUTHENTICATED),
        (ident(), "node-b", False, "node_mismatch", ErrorCode.FORBIDDEN),
        (ident(node=None), "node-a", False, "no_node_binding", ErrorCode.FORBIDDEN),
        (
            ident(user="system:serviceaccount:default:other"),
            "node-a",
            False,
            "wrong_service_account",
            ErrorCode.FORBIDDEN,
        ),
        (
            ident(user="system:serviceaccount:gpuhealth:gpuhealth-agent-x"),
            "node-a",
            False,
            "wrong_service_account",
            ErrorCode.FORBIDDEN,
        ),
        (
            ident(user="kubernetes-admin"),
            "node-a",
            False,
            "wrong_service_account",
            ErrorCode.FORBIDDEN,
        ),
    ],
)
def test_decide(
    identity: Identity | None, claimed: str, ok: bool, reason: str, code: ErrorCode | None
) -> None:
    d = decide(identity, claimed, audience="gpuhealth", username=AGENT)
    assert (d.ok, d.reason, d.code) == (ok, reason, code)


def test_node_binding_requires_exactly_one_value() -> None:
    two = Identity(
        authenticated=True,
        username=AGENT,
        audiences=("gpuhealth",),
        extra={NODE_NAME_KEY: ("node-a", "node-b")},
    )
    assert decide(two, "node-a", audience="gpuhealth", username=AGENT).reason == "no_node_binding"


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


async def test_caching_authenticator_ttl_bound_and_negatives() -> None:
    clock = FakeClock()
    inner = StaticAuthenticator(
        {"t1": ident(), "t2": ident(node="node-b"), "t3": ident(node="node-c")}
    )
    cache = CachingAuthenticator(inner, clock, ttl_s=10.0, max_entries=2)
    assert (await cache.review("t1")).node_name == "node-a"
    await cache.review("t1")
    assert inner.calls == 1
    clock.advance(11.0)
    await cache.review("t1")
    assert inner.calls == 2
    await cache.review("t2")
    await cache.review("t3")  # evicts t1 (least recently used)
    await cache.review("t1")
    assert inner.calls == 5
    await cache.review("bad")
    await cache.review("bad")
    assert inner.calls == 7  # negatives are never cached


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


async def test_heartbeats_queued_on_the_injected_clock(tmp_path: Path) -> None:
    import asyncio

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Heartbeat, decode
    from tests.support.stream import FakeAgentState

    clock = FakeClock()
    c = StreamClient(
        StreamClientSettings(heartbeat_interval_s=10.0),
        FakeAgentState("node-a"),
        Outbox(tmp_path),
        lambda: "t",
        clock=clock,
    )
    task = asyncio.create_task(c.run_heartbeats())
    try:
        await clock.advance_and_settle(0)  # let the task start sleeping
        await clock.advance_and_settle(9.9)
        assert len(c.outbox) == 0
        await clock.advance_and_settle(0.2)
        await clock.advance_and_settle(10.5)
        beats = [decode(e.frame) for e in c.outbox.entries()]
        assert [type(b) for b in beats] == [Heartbeat, Heartbeat]
        assert [b.seq for b in beats] == [1, 2]  # type: ignore[union-attr]
        assert beats[0].node == "node-a" and len(beats[0].telemetry) == 2  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        c.outbox.close()


def test_event_from_transition_maps_every_field() -> None:
    from gpuhealth.agent.stream.client import event_from_transition
    from tests.support.stream import transition

    t = transition(79, gpu=3)
    e = event_from_transition(12, "node-a", t)
    assert (e.seq, e.node, e.gpu_uuid, e.gpu_index, e.kind) == (
        12,
        "node-a",
        "GPU-3",
        3,
        "transition",
    )
    assert (e.previous, e.current, e.xid, e.at) == (t.previous, t.current, 79, t.at)


async def test_concurrency_limited_authenticator() -> None:
    import asyncio

    from gpuhealth.controller.stream.auth import ConcurrencyLimitedAuthenticator

    gate = asyncio.Event()
    running = 0
    peak = 0

    class Slow:
        async def review(self, token: str) -> Identity:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await gate.wait()
            running -= 1
            return ident()

    limited = ConcurrencyLimitedAuthenticator(Slow(), 3)
    tasks = [asyncio.create_task(limited.review(f"t{i}")) for i in range(10)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert peak == 3
    gate.set()
    results = await asyncio.gather(*tasks)
    assert all(r.authenticated for r in results) and peak == 3


def test_a_message_the_controller_would_reject_is_never_queued(tmp_path: Path) -> None:
    import dataclasses

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Condition
    from tests.support.stream import FakeAgentState, transition

    c = StreamClient(StreamClientSettings(), FakeAgentState("node-a"), Outbox(tmp_path), str)
    bad = Condition(reason="XidError", code="not a label value!", severity="unhealthy")
    c.publish(dataclasses.replace(transition(1), conditions=(bad,)))
    c.publish(transition(2))
    assert c.metrics.dropped["invalid"] == 1
    from gpuhealth.protocol import decode

    queued = [decode(e.frame) for e in c.outbox.entries()]
    assert [(m.seq, m.xid) for m in queued] == [(1, 2)]  # type: ignore[union-attr]
    c.outbox.close()
