"""Who may speak for a node: the pure authorization, bearer tokens, the review cache and
the limit on concurrent reviews."""

from __future__ import annotations

import asyncio

import pytest

from gpuhealth.controller.stream.auth import (
    NODE_NAME_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    CachingAuthenticator,
    Identity,
    StaticAuthenticator,
    authorize_agent,
    bearer_token,
    service_account_username,
)
from gpuhealth.protocol import ErrorCode
from tests.support.clock import FakeClock, settle

AGENT = service_account_username("gpuhealth", "gpuhealth-agent")


def ident(
    user: str = AGENT, node: str | None = "node-a", pod: str | None = "uid-a", **kw: object
) -> Identity:
    extra = {NODE_NAME_KEY: (node,)} if node is not None else {}
    if pod is not None:
        extra |= {POD_NAME_KEY: ("agent-a",), POD_UID_KEY: (pod,)}
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
        (ident(pod=None), "node-a", False, "no_pod_binding", ErrorCode.FORBIDDEN),
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
def test_authorize_agent(
    identity: Identity | None, claimed: str, ok: bool, reason: str, code: ErrorCode | None
) -> None:
    d = authorize_agent(identity, claimed, audience="gpuhealth", username=AGENT)
    assert (d.ok, d.reason, d.code) == (ok, reason, code)


def test_node_binding_requires_exactly_one_value() -> None:
    two = Identity(
        authenticated=True,
        username=AGENT,
        audiences=("gpuhealth",),
        extra={
            NODE_NAME_KEY: ("node-a", "node-b"),
            POD_NAME_KEY: ("agent-a",),
            POD_UID_KEY: ("uid-a",),
        },
    )
    assert (
        authorize_agent(two, "node-a", audience="gpuhealth", username=AGENT).reason
        == "no_node_binding"
    )


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
    await cache.review("t3")  # evicts t1 (the oldest review)
    await cache.review("t1")
    assert inner.calls == 5
    await cache.review("bad")
    await cache.review("bad")
    assert inner.calls == 7  # negatives are never cached


async def test_reviews_past_their_time_are_dropped_so_a_connected_fleet_keeps_none() -> None:
    """A positive review is kept ``ttl_s``, not until the bound pushes it out: the expiry
    task drops it (and its pod's index) once past its time, as does the next review; a hit
    does not extend it."""
    clock = FakeClock()
    inner = StaticAuthenticator({f"t{i}": ident(pod=f"uid-{i}") for i in range(5)})
    cache = CachingAuthenticator(inner, clock, ttl_s=10.0, max_entries=100)
    for i in range(3):
        await cache.review(f"t{i}")
        clock.advance(2.0)
    await cache.review("t0")  # a hit at 6 s: still due at 10 s
    assert len(cache) == 3 and inner.calls == 3
    clock.advance(4.5)  # 10.5 s: t0 is past its time, t1 (12 s) and t2 (14 s) are not
    assert cache.expire() == 1 and len(cache) == 2
    assert cache.forget_pod("uid-0") == 0  # its pod's index went with it
    task = asyncio.create_task(cache.run_expiry())
    try:
        await clock.settle()  # the task sleeps ttl_s
        await clock.advance_and_settle(10.0)
        assert len(cache) == 0  # the task expired the rest
        await cache.review("t3")  # the next review also drops what is past its time
        clock.advance(11.0)
        await cache.review("t4")
        assert len(cache) == 1 and inner.calls == 5
    finally:
        task.cancel()


async def test_a_gone_pod_takes_its_cached_reviews_with_it() -> None:
    clock = FakeClock()
    inner = StaticAuthenticator(
        {"old": ident(pod="uid-1"), "older": ident(pod="uid-1"), "other": ident(pod="uid-2")}
    )
    cache = CachingAuthenticator(inner, clock, ttl_s=10.0, max_entries=10)
    for token in ("old", "older", "other"):
        await cache.review(token)
    assert cache.forget_pod("uid-1") == 2 and len(cache) == 1
    await cache.review("old")
    await cache.review("other")
    assert inner.calls == 4  # reviewed again; the other pod's stays cached
    assert cache.forget_pod("uid-unknown") == 0


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
    await settle()
    assert peak == 3
    gate.set()
    results = await asyncio.gather(*tasks)
    assert all(r.authenticated for r in results) and peak == 3
