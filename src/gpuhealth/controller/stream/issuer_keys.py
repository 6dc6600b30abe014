"""The ServiceAccount token issuer's public keys, as the API server publishes them.

``/.well-known/openid-configuration`` names the issuer (the ``iss`` of every ServiceAccount
token it signs) and ``/openid/v1/jwks`` holds its public keys. Every ServiceAccount may read
both (the API server's default ``system:service-account-issuer-discovery`` binding), so the
controller needs no extra RBAC. With them an agent's bound token is verified locally
(:mod:`gpuhealth.controller.stream.bound_tokens`) instead of costing the API server a TokenReview.

The keys are fetched on first use, again once they are older than ``max_age_s`` (a key
removed from the API server stops being trusted within that time), and again when a token
names a key ID not among them (a key added), at most every ``unknown_key_refetch_s``. A
failed fetch leaves no keys, and every token goes to TokenReview until a later fetch works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from jwt import PyJWK, PyJWTError

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import ApiClient, KubeError, request

log = get_logger("kube.issuer_keys")

DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"
JWKS_MEDIA_TYPE = "application/jwk-set+json"
"""The only representation the API server offers of the key set (406 for any other)."""
SIGNING_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""Public-key algorithms only: a symmetric key in the set would let its holder sign tokens."""


class _Discovery(msgspec.Struct, frozen=True):
    issuer: str


class _KeySet(msgspec.Struct, frozen=True):
    keys: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class IssuerKeySet:
    """The issuer and its signing keys by key ID, as fetched once."""

    issuer: str
    keys: Mapping[str, PyJWK]
    fetched_at: float
    """Monotonic time of the fetch."""


def parse_key_set(issuer_doc: dict[str, Any], jwks: dict[str, Any], at: float) -> IssuerKeySet:
    """The issuer and its usable keys. Keys without an ID, not for signatures, or not of a
    public-key algorithm PyJWT can verify are left out; a document without an issuer is an
    error."""
    try:
        issuer = msgspec.convert(issuer_doc, _Discovery).issuer
        raw = msgspec.convert(jwks, _KeySet).keys
    except msgspec.ValidationError as exc:
        raise ValueError(f"issuer discovery not understood: {exc}") from exc
    if not issuer:
        raise ValueError("issuer discovery names no issuer")
    keys: dict[str, PyJWK] = {}
    for entry in raw:
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid or entry.get("use", "sig") != "sig":
            continue
        try:
            key = PyJWK(entry)
        except (PyJWTError, ValueError, TypeError) as exc:
            log.warning("issuer_key_unusable", kid=kid, error=str(exc))
            continue
        if key.algorithm_name in SIGNING_ALGORITHMS:
            keys[kid] = key
    return IssuerKeySet(issuer, keys, at)


class IssuerKeys:
    """The issuer's keys from the API server, refreshed as the module docstring says."""

    def __init__(
        self,
        api: ApiClient,
        clock: Clock,
        *,
        max_age_s: float,
        unknown_key_refetch_s: float,
        timeout_s: float = 10.0,
    ) -> None:
        self._api = api
        self._clock = clock
        self._max_age = max_age_s
        self._refetch = unknown_key_refetch_s
        self._timeout = timeout_s
        self._current: IssuerKeySet | None = None
        self._tried_at: float | None = None
        self._fetching: asyncio.Task[None] | None = None
        self.fetches = 0
        self.failures = 0

    async def key_set(self, kid: str) -> IssuerKeySet | None:
        """The key set to verify a token signed with ``kid``: fetched first when it is
        missing, too old, or lacks ``kid`` (and no fetch was tried too recently); None when
        no fetch has worked yet. A caller that comes while a fetch is in flight waits for it."""
        if self._fetching is not None and not self._fetching.done():
            await asyncio.shield(self._fetching)
            return self._current
        now = self._clock.monotonic()
        current = self._current
        recently = self._tried_at is not None and now - self._tried_at < self._refetch
        if current is None:
            fetch = not recently
        elif now - current.fetched_at >= self._max_age:
            fetch = True
        else:
            fetch = kid not in current.keys and not recently
        if fetch:
            await self._fetch()
        return self._current

    async def _fetch(self) -> None:
        """In a task of its own: a caller cancelled meanwhile does not cancel the others'."""
        self._tried_at = self._clock.monotonic()
        self._fetching = asyncio.create_task(self._fetch_once(), name="issuer-keys-fetch")
        await asyncio.shield(self._fetching)

    async def _fetch_once(self) -> None:
        self.fetches += 1
        try:
            issuer_doc = await request(self._api, "GET", DISCOVERY_PATH, timeout_s=self._timeout)
            jwks = await request(
                self._api, "GET", JWKS_PATH, timeout_s=self._timeout, accept=JWKS_MEDIA_TYPE
            )
            key_set = parse_key_set(issuer_doc, jwks, self._clock.monotonic())
        except (KubeError, ValueError) as exc:
            self.failures += 1
            stale = self._current
            if stale is not None and self._clock.monotonic() - stale.fetched_at >= self._max_age:
                self._current = None  # keys past their age are not trusted
            log.warning("issuer_keys_unavailable", error=str(exc))
            return
        previous, self._current = self._current, key_set
        if previous is None or (previous.issuer, set(previous.keys)) != (
            key_set.issuer,
            set(key_set.keys),
        ):
            log.info("issuer_keys_fetched", issuer=key_set.issuer, keys=sorted(key_set.keys))
