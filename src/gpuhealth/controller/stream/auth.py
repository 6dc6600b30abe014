"""Who may speak for a node: the authenticator seam, the pure policy, and a review cache.

The agent presents a projected ServiceAccount token (audience ``gpuhealth``) bound to its pod;
a TokenReview returns the ServiceAccount and, in ``status.user.extra``, the pod (name, UID) and
the node it was scheduled to. A connection is accepted only for the configured agent
ServiceAccount, only for the node the token is bound to, and only while that pod lives (the
stream server asks :mod:`gpuhealth.controller.stream.agent_pods`). Positive reviews are reused
for at most ``stream.auth_cache_ttl_s`` (never longer than the API server's own 10 s cache) and
dropped at once when their pod is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.protocol import ErrorCode

log = get_logger("controller.stream")

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True, slots=True)
class Identity:
    """The outcome of a token review."""

    authenticated: bool
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    audiences: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""

    def _one(self, key: str) -> str | None:
        values = self.extra.get(key, ())
        return values[0] if len(values) == 1 else None

    @property
    def node_name(self) -> str | None:
        return self._one(NODE_NAME_KEY)

    @property
    def pod_name(self) -> str | None:
        return self._one(POD_NAME_KEY)

    @property
    def pod_uid(self) -> str | None:
        return self._one(POD_UID_KEY)


class AuthUnavailable(TransientError):
    """The review could not be made (API server unreachable, 5xx); the agent should retry."""


class Authenticator(Protocol):
    async def review(self, token: str) -> Identity:
        """Review a bearer token; raises :class:`AuthUnavailable` when it cannot be reviewed."""


@dataclass(frozen=True, slots=True)
class AuthDecision:
    ok: bool
    reason: str = "accepted"
    """The ``reason`` label of ``gpuhealth_stream_rejected_total``."""
    code: ErrorCode | None = None
    message: str = ""


def service_account_username(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def authorize_agent(
    identity: Identity | None, claimed_node: str, *, audience: str, username: str
) -> AuthDecision:
    """May this identity speak for ``claimed_node``? (``None``: no bearer token presented.)"""
    unauth, forbidden = ErrorCode.UNAUTHENTICATED, ErrorCode.FORBIDDEN
    if identity is None:
        return AuthDecision(False, "missing_token", unauth, "a bearer token is required")
    if not identity.authenticated:
        return AuthDecision(False, "unauthenticated", unauth, "the token did not validate")
    # An authenticated review with no audiences means "valid for the API server's own
    # audience" (TokenReviewStatus docs): a client that asks for audiences must see its own.
    if audience not in identity.audiences:
        return AuthDecision(False, "wrong_audience", unauth, f"the token is not for {audience!r}")
    if identity.username != username:
        return AuthDecision(
            False, "wrong_service_account", forbidden, "not the agent ServiceAccount"
        )
    if identity.pod_uid is None or identity.pod_name is None:
        return AuthDecision(False, "no_pod_binding", forbidden, "the token is not bound to a pod")
    node = identity.node_name
    if node is None:
        return AuthDecision(False, "no_node_binding", forbidden, "the token is not bound to a node")
    if node != claimed_node:
        return AuthDecision(
            False, "node_mismatch", forbidden, f"the token is not valid for node {claimed_node!r}"
        )
    return AuthDecision(True)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class CachingAuthenticator:
    """Reuses positive reviews for ``ttl_s`` (bounded, keyed by the token's SHA-256).

    Negative results are never cached, so a fixed token or a new pod is seen at once; the
    reviews of a pod that is gone are dropped (:meth:`forget_pod`). Reviews are kept in the
    order they were made, which with one ``ttl_s`` for all is the order they expire: the
    oldest goes first when the bound is reached, and :meth:`expire` (every ``ttl_s``,
    :meth:`run_expiry`, and before each review) drops those past their time, so a fleet that
    stays connected keeps none (each held an identity, about 2 KiB per agent).
    """

    def __init__(
        self, inner: Authenticator, clock: Clock, *, ttl_s: float, max_entries: int
    ) -> None:
        self._inner = inner
        self._clock = clock
        self._ttl = ttl_s
        self._max = max_entries
        self._cache: OrderedDict[bytes, tuple[float, Identity]] = OrderedDict()
        self._by_pod: dict[str, set[bytes]] = {}

    async def review(self, token: str) -> Identity:
        key = hashlib.sha256(token.encode()).digest()
        self.expire()
        cached = self._cache.get(key)
        if cached is not None:
            return cached[1]
        identity = await self._inner.review(token)
        self._drop(key)
        if identity.authenticated:
            self._cache[key] = (self._clock.monotonic() + self._ttl, identity)
            if identity.pod_uid:
                self._by_pod.setdefault(identity.pod_uid, set()).add(key)
            while len(self._cache) > self._max:
                self._drop(next(iter(self._cache)))
        return identity

    def expire(self) -> int:
        """Drop the reviews past their time (the oldest first); returns how many."""
        now = self._clock.monotonic()
        dropped = 0
        while self._cache:
            key, (until, _) = next(iter(self._cache.items()))
            if until > now:
                break
            self._drop(key)
            dropped += 1
        return dropped

    async def run_expiry(self) -> None:
        """:meth:`expire` every ``ttl_s`` (a supervised task)."""
        while True:
            await self._clock.sleep(self._ttl)
            self.expire()

    def _drop(self, key: bytes) -> None:
        entry = self._cache.pop(key, None)
        uid = entry[1].pod_uid if entry is not None else None
        if uid is not None:
            keys = self._by_pod.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_pod[uid]

    def forget_pod(self, uid: str) -> int:
        """Drop every cached review of the pod with this UID; returns how many."""
        keys = self._by_pod.pop(uid, set())
        for key in keys:
            self._cache.pop(key, None)
        return len(keys)

    def __len__(self) -> int:
        return len(self._cache)


class ConcurrencyLimitedAuthenticator:
    """At most ``limit`` reviews in flight: after a controller restart thousands of agents
    reconnect at once, and each new token costs the API server a TokenReview."""

    def __init__(self, inner: Authenticator, limit: int) -> None:
        self._inner = inner
        self._sem = asyncio.Semaphore(max(1, limit))

    async def review(self, token: str) -> Identity:
        async with self._sem:
            return await self._inner.review(token)


class FailedReviewBudget:
    """Failed token reviews per client address: a token bucket each (``burst`` failures,
    one forgiven every ``1 / per_s`` seconds), bounded LRU (the least recently failing
    client forgotten first)."""

    def __init__(self, clock: Clock, *, per_s: float, burst: int, max_clients: int) -> None:
        self._clock = clock
        self._per_s = per_s
        self._burst = float(burst)
        self._max = max_clients
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """peer -> (failures still allowed, as of monotonic time)."""

    def _now_left(self, peer: str, now: float) -> float:
        left, at = self._left.get(peer, (self._burst, now))
        return min(self._burst, left + (now - at) * self._per_s)

    def exhausted(self, peer: str) -> bool:
        return peer in self._left and self._now_left(peer, self._clock.monotonic()) < 1.0

    def spend(self, peer: str) -> None:
        now = self._clock.monotonic()
        left = max(0.0, self._now_left(peer, now) - 1.0)
        self._left.pop(peer, None)
        self._left[peer] = (left, now)
        while len(self._left) > self._max:
            self._left.popitem(last=False)

    def __len__(self) -> int:
        return len(self._left)


class StaticAuthenticator:
    """A table of token -> Identity, for unit tests and the load benchmark (no API server)."""

    def __init__(self, table: Mapping[str, Identity]) -> None:
        self._table = dict(table)
        self.calls = 0

    async def review(self, token: str) -> Identity:
        self.calls += 1
        return self._table.get(token, Identity(authenticated=False, error="unknown token"))


class PodLiveness(Protocol):
    """The agent pods (:class:`gpuhealth.controller.stream.agent_pods.AgentPods`)."""

    def subscribe(self, listener: Callable[[str, str], None]) -> None:
        """``listener(uid, reason)`` when a pod is gone."""

    async def alive(self, uid: str, name: str) -> bool:
        """Raises :class:`~gpuhealth.common.errors.TransientError` when it cannot tell."""

    def bound(self, uid: str) -> tuple[str, str] | None:
        """(name, node) of the pod with this UID while the watch knows it alive, else None."""


THROTTLED = AuthDecision(
    False, "review_throttled", ErrorCode.RATE_LIMITED, "too many tokens did not validate"
)
UNAVAILABLE = AuthDecision(False, "review_unavailable", ErrorCode.INTERNAL, "retry")
POD_GONE = AuthDecision(
    False, "pod_gone", ErrorCode.UNAUTHENTICATED, "the pod this token is bound to is gone"
)


class AgentVerifier:
    """Who is on the other end of an agent's stream: its token verified (``local``: the
    bound-token verifier, :mod:`gpuhealth.controller.stream.bound_tokens`, in front of the reviews)
    or reviewed (at most ``auth_max_concurrent_reviews`` at once), positive answers cached, the
    policy of :func:`authorize_agent`, and the pod the token is bound to alive. An address
    whose tokens keep failing is refused without a review."""

    def __init__(
        self,
        settings: StreamServerSettings,
        authenticator: Authenticator,
        clock: Clock,
        pods: PodLiveness | None = None,
        *,
        local: Callable[[Authenticator], Authenticator] | None = None,
    ) -> None:
        self._settings = settings
        limited: Authenticator = ConcurrencyLimitedAuthenticator(
            authenticator, settings.auth_max_concurrent_reviews
        )
        if local is not None:
            limited = local(limited)
        self._cache = (
            CachingAuthenticator(
                limited,
                clock,
                ttl_s=settings.auth_cache_ttl_s,
                max_entries=settings.auth_cache_max_entries,
            )
            if settings.auth_cache_ttl_s > 0
            else None
        )
        self._auth: Authenticator = self._cache if self._cache is not None else limited
        self._failures = FailedReviewBudget(
            clock,
            per_s=settings.auth_failed_reviews_per_s,
            burst=settings.auth_failed_reviews_burst,
            max_clients=settings.auth_cache_max_entries,
        )
        self._username = service_account_username(
            settings.agent_namespace, settings.agent_service_account
        )
        self._pods = pods

    def forget_pod(self, uid: str) -> None:
        """The pod is gone: no cached review of its tokens is reused."""
        if self._cache is not None:
            self._cache.forget_pod(uid)

    @property
    def review_cache(self) -> CachingAuthenticator | None:
        """The cache of positive reviews (None when ``auth_cache_ttl_s`` is 0); its
        :meth:`~CachingAuthenticator.run_expiry` is a task of the controller."""
        return self._cache

    async def verify(
        self, token: str | None, node: str, peer: str | None, gone: Callable[[str], bool]
    ) -> tuple[Identity | None, AuthDecision] | None:
        """The reviewed identity and the decision for a connection claiming ``node``; None
        when ``gone(stage)`` says the agent closed the connection meanwhile (no more work)."""
        identity: Identity | None = None
        if token is not None and self._failures.exhausted(peer or ""):
            return None, THROTTLED
        if token is not None:
            if gone("review"):
                return None
            try:
                identity = await self._auth.review(token)
            except AuthUnavailable as exc:
                if gone("review"):
                    return None
                log.warning("stream_review_unavailable", claimed_node=node, error=str(exc))
                return None, UNAVAILABLE
            if not identity.authenticated:
                self._failures.spend(peer or "")
            if gone("review"):
                return None
        s = self._settings
        decision = authorize_agent(identity, node, audience=s.audience, username=self._username)
        if decision.ok and identity is not None and self._pods is not None:
            decision = await self._pod_alive(identity)
            if gone("pod_check"):
                return None
        return identity, decision

    async def _pod_alive(self, identity: Identity) -> AuthDecision:
        """Accepted while the token's pod lives; a pod that is gone forgets its reviews."""
        assert self._pods is not None and identity.pod_uid and identity.pod_name
        try:
            alive = await self._pods.alive(identity.pod_uid, identity.pod_name)
        except TransientError as exc:
            log.warning("stream_pod_check_unavailable", pod=identity.pod_name, error=str(exc))
            return UNAVAILABLE
        if alive:
            return AuthDecision(True)
        self.forget_pod(identity.pod_uid)
        return POD_GONE
