"""An agent's bound token verified here, the API server's TokenReview kept for every doubt.

After a failover every agent presents its token at once, and a TokenReview per agent kept
the API server busy for the whole cold start (bench ``fleet_scale``: kube-apiserver at a full
core while 19,000 agents connected, the rest of the cluster waiting behind it). A bound
ServiceAccount token is a JWT signed by the API server's issuer: with the issuer's published
keys (:mod:`gpuhealth.controller.stream.issuer_keys`) and the agent pods' watch, the controller
checks what a TokenReview would, and accepts the token without one when **every** fact holds:

- the signature, by a key the issuer publishes, with that key's algorithm;
- ``iss`` is the issuer, ``aud`` carries the stream's audience, now is within
  ``nbf``..``exp`` (no leeway: a token near its edges goes to the API server);
- it is the agent ServiceAccount's (``sub`` and the ``kubernetes.io`` claims), and that
  account's UID is the one a TokenReview confirmed within ``stream.auth_local_trust_s`` (an
  account deleted and made again has a new UID: its old tokens are not honoured);
- it is bound to a pod the agent-pod watch knows alive, of that name, on the node the token
  names (a pod's node never changes; a pod that is gone is refused by the watch at once),
  and that Node, as the node watch knows it, has the UID the token names (a Node deleted and
  made again under the same name has another).

When the trust in the account's UID ends while the review that renews it has not answered
(a slow API server in a storm), the tokens that lack only that confirmation wait for that one
answer instead of a review each (which had queued every handshake behind dozens of reviews).

Anything else — not a JWT, a key ID not published, another issuer, a time, account, pod or
node that does not match — is decided by a TokenReview, as before, so the local path can
only ever accept what the API server would. The one answer given here without it is a
forgery: a signature that does not match the published key of that ID.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec
from jwt import (
    InvalidAlgorithmError,
    InvalidSignatureError,
    PyJWS,
    PyJWTError,
    get_unverified_header,
)

from gpuhealth.common.clock import Clock
from gpuhealth.controller.stream.auth import (
    NODE_NAME_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    Authenticator,
    AuthUnavailable,
    Identity,
    service_account_username,
)
from gpuhealth.controller.stream.issuer_keys import IssuerKeySet

NODE_UID_KEY = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"

_jws = PyJWS()


class SigningKeys(Protocol):
    """The issuer's keys (:class:`gpuhealth.controller.stream.issuer_keys.IssuerKeys`)."""

    async def key_set(self, kid: str) -> IssuerKeySet | None:
        """The key set to verify a token signed with ``kid``, or None when none is known."""


@dataclass(frozen=True, slots=True)
class TokenFacts:
    """What a bound token is checked against besides its pod (the stream's pod watch): the
    issuer's keys and the Nodes' UIDs."""

    keys: SigningKeys
    node_uid: Callable[[str], str | None]
    """The UID of the Node of this name as the node watch knows it, or None."""


class BoundPods(Protocol):
    """The agent pods' watch (:class:`gpuhealth.controller.stream.agent_pods.AgentPods`)."""

    def bound(self, uid: str) -> tuple[str, str] | None:
        """(name, node) of the pod with this UID while the watch knows it alive, else None."""


class _Ref(msgspec.Struct, frozen=True):
    name: str = ""
    uid: str = ""


class _Kube(msgspec.Struct, frozen=True):
    namespace: str = ""
    pod: _Ref | None = None
    node: _Ref | None = None
    serviceaccount: _Ref | None = None


class Claims(msgspec.Struct, frozen=True):
    """The claims of a ServiceAccount token that the decision reads."""

    iss: str = ""
    sub: str = ""
    aud: list[str] | str = msgspec.field(default_factory=list)
    exp: float | None = None
    nbf: float | None = None
    jti: str = ""
    kube: _Kube | None = msgspec.field(default=None, name="kubernetes.io")


_claims = msgspec.json.Decoder(Claims)


UNCONFIRMED = "account_unconfirmed"
"""Why a token goes to the API server when everything else holds but the account's UID was
not confirmed within the trust."""


def vouch(
    claims: Claims,
    now: float,
    *,
    issuer: str,
    audience: str,
    namespace: str,
    service_account: str,
    account_uid: str | None,
    pod: tuple[str, str] | None,
    node_uid: str | None,
) -> Identity | str:
    """The identity a TokenReview would return for a token whose signature is verified, or
    why the API server must decide (``now``: seconds since the epoch; ``account_uid``: the
    agent ServiceAccount's UID as last confirmed, None when not recently; ``pod``: (name,
    node) of the token's pod as the watch knows it alive, None when it does not;
    ``node_uid``: the UID of the Node the token names, as the node watch knows it, None when
    it does not)."""
    if claims.iss != issuer:
        return "issuer"
    audiences = [claims.aud] if isinstance(claims.aud, str) else claims.aud
    if audience not in audiences:
        return "audience"
    if claims.exp is None or now >= claims.exp or (claims.nbf is not None and now < claims.nbf):
        return "time"
    kube = claims.kube
    username = service_account_username(namespace, service_account)
    account = kube.serviceaccount if kube is not None else None
    if (
        kube is None
        or account is None
        or claims.sub != username
        or kube.namespace != namespace
        or account.name != service_account
    ):
        return "account"
    if account_uid is None or account.uid != account_uid:
        return UNCONFIRMED
    bound_pod, node = kube.pod, kube.node
    if bound_pod is None or not bound_pod.name or not bound_pod.uid or node is None:
        return "binding"
    if pod is None:
        return "pod_unknown"
    if pod != (bound_pod.name, node.name) or not node.name:
        return "binding"
    if node.uid and node.uid != node_uid:
        return "node"
    extra: dict[str, tuple[str, ...]] = {
        POD_NAME_KEY: (bound_pod.name,),
        POD_UID_KEY: (bound_pod.uid,),
        NODE_NAME_KEY: (node.name,),
    }
    if node.uid:
        extra[NODE_UID_KEY] = (node.uid,)
    if claims.jti:
        extra[CREDENTIAL_ID_KEY] = (f"JTI={claims.jti}",)
    return Identity(
        authenticated=True,
        username=username,
        uid=account_uid,
        groups=(
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ),
        audiences=(audience,),
        extra=extra,
    )


def _bound_pod_uid(claims: Claims) -> str:
    kube = claims.kube
    return kube.pod.uid if kube is not None and kube.pod is not None else ""


def _bound_node(claims: Claims) -> str:
    kube = claims.kube
    return kube.node.name if kube is not None and kube.node is not None else ""


class BoundTokenAuthenticator:
    """Verifies an agent's token here when it can (the module docstring), else asks
    ``review`` (the TokenReview authenticator, concurrency-limited), whose answers for the
    agent ServiceAccount renew the trust in its UID."""

    def __init__(
        self,
        facts: TokenFacts,
        pods: BoundPods,
        review: Authenticator,
        clock: Clock,
        *,
        audience: str,
        namespace: str,
        service_account: str,
        trust_s: float,
        counts: Counter[str],
    ) -> None:
        self._keys = facts.keys
        self._node_uid = facts.node_uid
        self._pods = pods
        self._review = review
        self._clock = clock
        self._audience = audience
        self._namespace = namespace
        self._service_account = service_account
        self._username = service_account_username(namespace, service_account)
        self._trust_s = trust_s
        self._account: tuple[str, float] | None = None
        """(the agent ServiceAccount's UID, monotonic time until which it is trusted)."""
        self._renewing = False
        self._confirming: asyncio.Event | None = None
        """Set (to be set when it answers) while a review that can confirm the account runs: a
        renewal, or the review of a token that lacked only that confirmation."""
        self._counts = counts
        """How tokens were decided: ``local``, ``forged`` or ``review_<why>``."""

    async def review(self, token: str) -> Identity:
        outcome = await self._local(token)
        confirming = self._confirming
        if outcome == UNCONFIRMED and confirming is not None:
            # The trust ended while a review that can renew it runs (an API server slow in a
            # storm): wait for that one answer instead of sending one more review per agent
            # (each behind the others, in the reviews' concurrency limit). Only a token whose
            # signature, issuer, audience, time and account name hold, and once: what it still
            # lacks after that answer (a refusal, a failure, its pod) goes to its own review.
            await confirming.wait()
            outcome = await self._local(token)
        if isinstance(outcome, Identity):
            if outcome.authenticated and self._renewal_due():
                return await self._renew(token, outcome)
            self._counts["local" if outcome.authenticated else "forged"] += 1
            return outcome
        self._counts[f"review_{outcome}"] += 1
        return await self._reviewed(token, "unconfirmed" if outcome == UNCONFIRMED else None)

    async def _reviewed(
        self, token: str, confirms: Literal["renewal", "unconfirmed"] | None = None
    ) -> Identity:
        """The API server's TokenReview of ``token``. One that ``confirms`` the account (a
        renewal, or a token that lacked only the confirmation) is the one others wait for when
        none runs yet; they are woken once the trust reflects its answer. A renewal refused
        ends the trust: the API server refuses a token accepted here, so something changed
        that the controller cannot see (the account, a key)."""
        mine = None
        if confirms is not None and self._confirming is None:
            mine = self._confirming = asyncio.Event()
        try:
            identity = await self._review.review(token)
            if identity.authenticated and identity.username == self._username and identity.uid:
                self._account = (identity.uid, self._clock.monotonic() + self._trust_s)
            elif confirms == "renewal" and not identity.authenticated:
                self._account = None
            return identity
        finally:
            if mine is not None:
                self._confirming = None
                mine.set()

    def _account_uid(self) -> str | None:
        account = self._account
        return account[0] if account is not None and self._clock.monotonic() < account[1] else None

    def _renewal_due(self) -> bool:
        """Past half of the trust: the next token accepted here is reviewed instead (one at a
        time), so that a steady stream of agents renews the trust without a burst of reviews
        when it would end."""
        account = self._account
        return (
            not self._renewing
            and account is not None
            and self._clock.monotonic() >= account[1] - self._trust_s / 2
        )

    async def _renew(self, token: str, here: Identity) -> Identity:
        """A token this verifier accepts (``here``), reviewed by the API server (refused: no
        trust until a review confirms the account again). If the review cannot be made, the
        trust (still good) decides and the renewal waits for the next."""
        self._counts["review_renewal"] += 1
        self._renewing = True
        try:
            return await self._reviewed(token, "renewal")
        except AuthUnavailable:
            return here
        finally:
            self._renewing = False

    async def _local(self, token: str) -> Identity | str:
        try:
            header: Mapping[str, object] = get_unverified_header(token)
        except PyJWTError:
            return "not_a_jwt"
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            return "unknown_key"
        key_set = await self._keys.key_set(kid)
        if key_set is None:
            return "no_keys"
        key = key_set.keys.get(kid)
        if key is None:
            return "unknown_key"
        try:
            payload = _jws.decode_complete(token, key, algorithms=[key.algorithm_name])["payload"]
        except InvalidSignatureError:
            return Identity(authenticated=False, error="the token's signature is not the issuer's")
        except InvalidAlgorithmError:
            return "algorithm"
        except PyJWTError:
            return "not_a_jwt"
        try:
            claims = _claims.decode(payload)
        except msgspec.DecodeError:
            return "claims"
        return vouch(
            claims,
            self._clock.now().timestamp(),
            issuer=key_set.issuer,
            audience=self._audience,
            namespace=self._namespace,
            service_account=self._service_account,
            account_uid=self._account_uid(),
            pod=self._pods.bound(_bound_pod_uid(claims)),
            node_uid=self._node_uid(_bound_node(claims)),
        )
