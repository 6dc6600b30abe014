"""The HTTP authorizer: 401/403/503 with JSON bodies, metrics, the caches
(controller/http/auth.py) over a table authenticator and a recorded access reviewer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.http.access import Access
from gpuhealth.controller.http.access_review import AccessVerdict, review_body
from gpuhealth.controller.http.auth import HttpAuthMetrics, HttpAuthorizer
from gpuhealth.controller.http.settings import HttpAuthSettings
from gpuhealth.controller.stream.auth import (
    AuthUnavailable,
    FailedReviewBudget,
    Identity,
    StaticAuthenticator,
)
from tests.support.clock import FakeClock

OPERATOR = Identity(authenticated=True, username="alice", uid="u1", groups=("ops",))
NOBODY = Identity(authenticated=True, username="mallory", uid="u2")
TOKENS = {"alice-token": OPERATOR, "mallory-token": NOBODY}


@dataclass
class Reviewer:
    allowed_users: set[str] = field(default_factory=lambda: {"alice"})
    calls: list[tuple[str, Access]] = field(default_factory=list)
    down: bool = False

    async def review(self, identity: Identity, access: Access) -> AccessVerdict:
        self.calls.append((identity.username, access))
        if self.down:
            raise AuthUnavailable("API server down")
        return AccessVerdict(identity.username in self.allowed_users)


class Down:
    async def review(self, token: str) -> Identity:
        raise AuthUnavailable("API server down")


async def ok(_req: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def app(authorizer: HttpAuthorizer) -> web.Application:
    a = web.Application(middlewares=[authorizer.middleware])
    a.router.add_post("/api/v1/breaker/reset", ok)
    a.router.add_get("/api/v1/fleet", ok)
    a.router.add_get("/healthz", ok)
    return a


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reviewer() -> Reviewer:
    return Reviewer()


def authorizer(
    clock: FakeClock, reviewer: Reviewer, *, reads: str = "open", authn: object = None
) -> HttpAuthorizer:
    settings = HttpAuthSettings(reads=reads, cache_ttl_s=5.0)  # type: ignore[arg-type]
    return HttpAuthorizer(
        settings,
        authn or StaticAuthenticator(TOKENS),  # type: ignore[arg-type]
        reviewer,
        namespace="gpuhealth",
        clock=clock,
        metrics=HttpAuthMetrics(None),
    )


@pytest.fixture
async def client(clock: FakeClock, reviewer: Reviewer) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app(authorizer(clock, reviewer)))) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def count(auth: HttpAuthorizer, rule: str, result: str) -> float:
    return auth.metrics.checks.labels(rule, result)._value.get()


async def test_reset_needs_a_token_that_may_update_the_breaker(
    clock: FakeClock, reviewer: Reviewer
) -> None:
    auth = authorizer(clock, reviewer)
    async with TestClient(TestServer(app(auth))) as c:
        none = await c.post("/api/v1/breaker/reset")
        assert none.status == 401
        assert none.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await none.json())["error"] == "unauthenticated"
        bad = await c.post("/api/v1/breaker/reset", headers=bearer("forged"))
        assert bad.status == 401
        basic = await c.post("/api/v1/breaker/reset", headers={"Authorization": "Basic eDp5"})
        assert basic.status == 401
        denied = await c.post("/api/v1/breaker/reset", headers=bearer("mallory-token"))
        assert denied.status == 403
        body = await denied.json()
        assert body["error"] == "forbidden"
        assert "mallory" in body["message"] and "circuitbreakers.gpuhealth.io" in body["message"]
        allowed = await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))
        assert allowed.status == 200
    assert [u for u, _ in reviewer.calls] == ["mallory", "alice"]  # no review without a user
    assert count(auth, "operator", "unauthenticated") == 3
    assert count(auth, "operator", "forbidden") == 1
    assert count(auth, "operator", "allowed") == 1


async def test_reads_are_open_by_default_and_probes_always(client: TestClient) -> None:
    assert (await client.get("/api/v1/fleet")).status == 200
    assert (await client.get("/healthz")).status == 200


async def test_reads_can_require_authorization(clock: FakeClock, reviewer: Reviewer) -> None:
    auth = authorizer(clock, reviewer, reads="authorized")
    async with TestClient(TestServer(app(auth))) as c:
        assert (await c.get("/api/v1/fleet")).status == 401
        assert (await c.get("/api/v1/fleet", headers=bearer("mallory-token"))).status == 403
        assert (await c.get("/api/v1/fleet", headers=bearer("alice-token"))).status == 200
        assert (await c.get("/healthz")).status == 200
    assert count(auth, "read", "allowed") == 1


async def test_allowing_reviews_are_reused_for_the_ttl_refusals_never(
    clock: FakeClock, reviewer: Reviewer
) -> None:
    auth = authorizer(clock, reviewer)
    async with TestClient(TestServer(app(auth))) as c:
        for _ in range(3):
            assert (await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))).ok
            assert (
                await c.post("/api/v1/breaker/reset", headers=bearer("mallory-token"))
            ).status == 403
        assert [u for u, _ in reviewer.calls] == ["alice", "mallory", "mallory", "mallory"]
        reviewer.allowed_users.add("mallory")  # a Role granted: works at once
        assert (await c.post("/api/v1/breaker/reset", headers=bearer("mallory-token"))).ok
        reviewer.allowed_users.clear()  # revoked: still allowed until the TTL passes
        assert (await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))).ok
        clock.advance(5.0)
        assert (await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))).status == 403


async def test_review_unavailable_is_503_and_retried(clock: FakeClock, reviewer: Reviewer) -> None:
    auth = authorizer(clock, reviewer, authn=Down())
    async with TestClient(TestServer(app(auth))) as c:
        resp = await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"] == "auth_unavailable"
    reviewer.down = True
    auth = authorizer(clock, reviewer)
    async with TestClient(TestServer(app(auth))) as c:
        resp = await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))
        assert resp.status == 503
        reviewer.down = False
        assert (await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))).ok
    assert count(auth, "operator", "unavailable") == 1


def test_review_body_carries_the_reviewed_user_and_the_attributes() -> None:
    ident = Identity(
        authenticated=True,
        username="system:serviceaccount:ops:alice",
        uid="u1",
        groups=("system:serviceaccounts", "system:authenticated"),
        extra={"authentication.kubernetes.io/pod-name": ("p",)},
    )
    auth = authorizer(FakeClock(), Reviewer())
    need = auth.requirement(_Req("POST", "/api/v1/breaker/reset"))
    assert need is not None
    body = review_body(ident, need.access)
    assert body["spec"] == {
        "user": "system:serviceaccount:ops:alice",
        "uid": "u1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        "resourceAttributes": {
            "verb": "update",
            "group": "gpuhealth.io",
            "resource": "circuitbreakers",
            "namespace": "gpuhealth",
        },
    }


@dataclass
class _Req:
    method: str
    path: str


async def test_a_client_sending_bad_tokens_is_throttled_before_the_api_server_is_asked(
    clock: FakeClock, reviewer: Reviewer
) -> None:
    """Many distinct forged tokens from one address: refusals are never cached, so each would
    cost the API server a TokenReview; after the burst the client gets 429 without one."""
    authn = StaticAuthenticator(TOKENS)
    auth = authorizer(clock, reviewer, authn=authn)
    burst = auth.settings.failed_reviews_burst
    async with TestClient(TestServer(app(auth))) as c:
        statuses = [
            (await c.post("/api/v1/breaker/reset", headers=bearer(f"forged-{i}"))).status
            for i in range(burst + 40)
        ]
        assert statuses[:burst] == [401] * burst
        assert set(statuses[burst:]) == {429}
        assert authn.calls == burst  # the API server was asked only for the burst
        throttled = await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))
        assert throttled.status == 429 and throttled.headers["Retry-After"]
        assert (await throttled.json())["error"] == "too_many_failed_reviews"
        assert count(auth, "operator", "throttled") == 41
        clock.advance(1.0 / auth.settings.failed_reviews_per_s)  # one failure forgiven
        assert (await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))).status == 200
        # good tokens spend nothing: the operator keeps working
        for _ in range(3 * burst):
            ok_ = await c.post("/api/v1/breaker/reset", headers=bearer("alice-token"))
            assert ok_.status == 200


def test_failed_review_budget_is_per_client_and_bounded(clock: FakeClock) -> None:
    budget = FailedReviewBudget(clock, per_s=1.0, burst=2, max_clients=3)
    for _ in range(2):
        budget.spend("10.0.0.1")
    assert budget.exhausted("10.0.0.1")
    assert not budget.exhausted("10.0.0.2")
    clock.advance(1.0)  # one failure forgiven per second
    assert not budget.exhausted("10.0.0.1")
    budget.spend("10.0.0.1")
    assert budget.exhausted("10.0.0.1")
    for peer in ("10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"):
        budget.spend(peer)
    assert len(budget) == 3  # the least recently failing clients are forgotten first
