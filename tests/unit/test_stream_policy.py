"""Pure pieces of the stream: backoff, token file, rate limit, auth policy, sequence rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.stream.backoff import Backoff, backoff_delay
from agent.stream.settings import BackoffSettings
from agent.stream.token import TokenFile
from common.clock import FakeClock
from common.errors import TransientError
from controller.stream.auth import (
    NODE_NAME_KEY,
    CachingAuthenticator,
    Identity,
    StaticAuthenticator,
    bearer_token,
    decide,
    service_account_username,
)
from controller.stream.limits import TokenBucket
from controller.stream.session import SeqTracker, check_seq
from protocol import ErrorCode

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
    two = Identity(authenticated=True, username=AGENT, extra={NODE_NAME_KEY: ("node-a", "node-b")})
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
