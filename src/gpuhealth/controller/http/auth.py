"""Authentication and authorization of the controller's HTTP callers (the way kube-rbac-proxy
does it): the bearer token is reviewed (TokenReview), then the request's access
(:mod:`gpuhealth.controller.http.access`) is asked of the API server (SubjectAccessReview).

- No or an invalid token: 401 (``WWW-Authenticate: Bearer``); a valid token that may not: 403;
  the API server could not be asked: 503 with ``Retry-After``. Each a JSON body
  ``{"error": ..., "message": ...}``, each counted in ``gpuhealth_http_auth_total{rule,
  result}`` and logged with the caller's name.
- Positive TokenReviews and allowing SubjectAccessReviews are reused for ``http.auth.
  cache_ttl_s`` (at most 10 s; bounded LRUs, tokens keyed by their SHA-256); refusals are
  never cached, so a granted Role works at once. At most ``max_concurrent_reviews`` reviews
  are in flight.
- A client address whose tokens keep failing review is answered 429 (``Retry-After``) without
  a review once it spent ``failed_reviews_burst``; one failure is forgiven every
  ``1 / failed_reviews_per_s`` seconds (a token bucket per address, bounded LRU).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.http.access import Access, AccessRequirement, required_access
from gpuhealth.controller.http.settings import HttpAuthSettings
from gpuhealth.controller.stream.auth import (
    Authenticator,
    AuthUnavailable,
    CachingAuthenticator,
    ConcurrencyLimitedAuthenticator,
    FailedReviewBudget,
    Identity,
    bearer_token,
)

log = get_logger("controller.http_auth")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_S = "1"


class AuthVerdict(Protocol):
    @property
    def allowed(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class AccessReviewer(Protocol):
    """:class:`gpuhealth.controller.http.access_review.SubjectAccessReviewer`."""

    async def review(self, identity: Identity, access: Access) -> AuthVerdict:
        """Raises :class:`AuthUnavailable` when it cannot be asked."""


class HttpAuthMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.checks = Counter(
            "gpuhealth_http_auth",
            "Checked HTTP requests by rule (operator, read, metrics, replica, other) and result "
            "(allowed, unauthenticated, forbidden, unavailable, throttled)",
            ["rule", "result"],
            registry=registry,
        )


class AllowCache:
    """Allowing access decisions per (caller, access), for ``ttl_s``; bounded LRU."""

    def __init__(self, clock: Clock, *, ttl_s: float, max_entries: int) -> None:
        self._clock = clock
        self._ttl = ttl_s
        self._max = max_entries
        self._until: OrderedDict[tuple[object, ...], float] = OrderedDict()

    @staticmethod
    def key(identity: Identity, access: Access) -> tuple[object, ...]:
        extra = tuple(sorted(identity.extra.items()))
        return (identity.username, identity.uid, identity.groups, extra, access)

    def allowed(self, key: tuple[object, ...]) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= self._clock.monotonic():
            del self._until[key]
            return False
        self._until.move_to_end(key)
        return True

    def remember(self, key: tuple[object, ...]) -> None:
        if self._ttl <= 0:
            return
        self._until[key] = self._clock.monotonic() + self._ttl
        self._until.move_to_end(key)
        while len(self._until) > self._max:
            self._until.popitem(last=False)

    def __len__(self) -> int:
        return len(self._until)


def problem(status: int, error: str, message: str) -> web.Response:
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="gpuhealth-controller"'
    elif status in (429, 503):
        headers["Retry-After"] = RETRY_AFTER_S
    return web.json_response({"error": error, "message": message}, status=status, headers=headers)


class HttpAuthorizer:
    """The check in front of every route (:meth:`middleware`)."""

    def __init__(
        self,
        settings: HttpAuthSettings,
        authenticator: Authenticator,
        reviewer: AccessReviewer,
        *,
        namespace: str,
        clock: Clock,
        metrics: HttpAuthMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.metrics = metrics or HttpAuthMetrics()
        sem = asyncio.Semaphore(settings.max_concurrent_reviews)
        limited = ConcurrencyLimitedAuthenticator(authenticator, settings.max_concurrent_reviews)
        self._tokens: Authenticator = (
            CachingAuthenticator(
                limited, clock, ttl_s=settings.cache_ttl_s, max_entries=settings.cache_max_entries
            )
            if settings.cache_ttl_s > 0
            else limited
        )
        self._reviewer = reviewer
        self._sem = sem
        self.allow_cache = AllowCache(
            clock, ttl_s=settings.cache_ttl_s, max_entries=settings.cache_max_entries
        )
        self.failures = FailedReviewBudget(
            clock,
            per_s=settings.failed_reviews_per_s,
            burst=settings.failed_reviews_burst,
            max_clients=settings.cache_max_entries,
        )

    def requirement(self, request: web.BaseRequest) -> AccessRequirement | None:
        return required_access(
            request.method,
            request.path,
            reads_authorized=self.settings.reads == "authorized",
            namespace=self.namespace,
        )

    async def check(self, request: web.BaseRequest, need: AccessRequirement) -> web.Response | None:
        """None when the caller may; else the answer to send."""
        result, answer = await self._check(request, need)
        self.metrics.checks.labels(need.rule, result).inc()
        return answer

    async def _check(
        self, request: web.BaseRequest, need: AccessRequirement
    ) -> tuple[str, web.Response | None]:
        what = need.access.describe()
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            return "unauthenticated", problem(
                401, "unauthenticated", f"a bearer token is required to {what}"
            )
        peer = request.remote or ""
        if self.failures.exhausted(peer):
            return "throttled", problem(
                429, "too_many_failed_reviews", "too many tokens from this address did not validate"
            )
        try:
            identity = await self._tokens.review(token)
        except AuthUnavailable as exc:
            log.warning("http_auth_unavailable", path=request.path, error=str(exc))
            return "unavailable", problem(503, "auth_unavailable", "cannot review the token now")
        if not identity.authenticated:
            self.failures.spend(peer)
            log.warning("http_unauthenticated", path=request.path, peer=request.remote)
            return "unauthenticated", problem(
                401, "unauthenticated", "the bearer token did not validate"
            )
        key = AllowCache.key(identity, need.access)
        if not self.allow_cache.allowed(key):
            try:
                async with self._sem:
                    verdict = await self._reviewer.review(identity, need.access)
            except AuthUnavailable as exc:
                log.warning("http_auth_unavailable", path=request.path, error=str(exc))
                return "unavailable", problem(
                    503, "auth_unavailable", "cannot review the access now"
                )
            if not verdict.allowed:
                log.warning(
                    "http_forbidden", user=identity.username, access=what, path=request.path
                )
                return "forbidden", problem(
                    403, "forbidden", f"user {identity.username!r} may not {what}"
                )
            self.allow_cache.remember(key)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            log.info(
                "http_authorized", user=identity.username, method=request.method, path=request.path
            )
        return "allowed", None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        need = self.requirement(request)
        if need is not None:
            refused = await self.check(request, need)
            if refused is not None:
                return refused
        return await handler(request)
