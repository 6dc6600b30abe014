"""Bound tokens verified by the controller: accepted only when every fact a TokenReview
checks holds here, a forgery refused, and everything else sent to the review."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections import Counter
from dataclasses import replace
from typing import Any

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.controller.kube.rest import TransientKubeError
from gpuhealth.controller.stream import issuer_keys
from gpuhealth.controller.stream.auth import AuthUnavailable, Identity, authorize_agent
from gpuhealth.controller.stream.bound_tokens import (
    BoundTokenAuthenticator,
    Claims,
    TokenFacts,
    vouch,
)
from gpuhealth.controller.stream.issuer_keys import IssuerKeys, IssuerKeySet, parse_key_set
from tests.support.clock import FakeClock

ISSUER = "https://kubernetes.default.svc.cluster.local"
NS, SA, SA_UID = "gpuhealth", "gpuhealth-agent", "sa-uid-1"
USERNAME = f"system:serviceaccount:{NS}:{SA}"
POD, POD_UID, NODE, NODE_UID = "agent-x", "pod-uid-1", "gpu-1", "node-uid-1"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(jwt.get_algorithm_by_name(alg).to_jwk(key.public_key()))
    return {**entry, "kid": kid, "alg": alg, "use": "sig"}


JWKS = {"keys": [jwk(RSA_KEY, "rsa-1", "RS256"), jwk(EC_KEY, "ec-1", "ES256")]}


def claims(now: float, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "aud": ["gpuhealth"],
        "exp": now + 600,
        "iat": now - 10,
        "nbf": now - 10,
        "iss": ISSUER,
        "jti": "jti-1",
        "sub": USERNAME,
        "kubernetes.io": {
            "namespace": NS,
            "node": {"name": NODE, "uid": NODE_UID},
            "pod": {"name": POD, "uid": POD_UID},
            "serviceaccount": {"name": SA, "uid": SA_UID},
        },
    }
    body.update(over)
    return body


def sign(body: dict[str, Any], key: Any = RSA_KEY, kid: str = "rsa-1", alg: str = "RS256") -> str:
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


class Keys:
    def __init__(self, key_set: IssuerKeySet | None) -> None:
        self.key_set_value = key_set
        self.asked: list[str] = []

    async def key_set(self, kid: str) -> IssuerKeySet | None:
        self.asked.append(kid)
        return self.key_set_value


class Pods:
    def __init__(self) -> None:
        self.live: dict[str, tuple[str, str]] = {POD_UID: (POD, NODE)}
        self.nodes: dict[str, str] = {NODE: NODE_UID, "gpu-9": "n9"}

    def bound(self, uid: str) -> tuple[str, str] | None:
        return self.live.get(uid)

    def node_uid(self, name: str) -> str | None:
        return self.nodes.get(name)


REVIEWED = Identity(
    authenticated=True,
    username=USERNAME,
    uid=SA_UID,
    groups=("system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"),
    audiences=("gpuhealth",),
    extra={
        "authentication.kubernetes.io/pod-name": (POD,),
        "authentication.kubernetes.io/pod-uid": (POD_UID,),
        "authentication.kubernetes.io/node-name": (NODE,),
        "authentication.kubernetes.io/node-uid": (NODE_UID,),
        "authentication.kubernetes.io/credential-id": ("JTI=jti-1",),
    },
)
"""What the API server's TokenReview says of ``claims()`` (the integration test compares the
two against the real one)."""


class Review:
    def __init__(self, identity: Identity = REVIEWED) -> None:
        self.identity = identity
        self.tokens: list[str] = []

    async def review(self, token: str) -> Identity:
        self.tokens.append(token)
        return self.identity


def make(
    clock: FakeClock, review: Review | None = None, trust_s: float = 10.0
) -> tuple[BoundTokenAuthenticator, Review, Pods, Keys, Counter[str]]:
    review = review or Review()
    pods, counts = Pods(), Counter[str]()
    keys = Keys(parse_key_set({"issuer": ISSUER}, JWKS, clock.monotonic()))
    auth = BoundTokenAuthenticator(
        TokenFacts(keys, pods.node_uid),
        pods,
        review,
        clock,
        audience="gpuhealth",
        namespace=NS,
        service_account=SA,
        trust_s=trust_s,
        counts=counts,
    )
    return auth, review, pods, keys, counts


# -- the pure decision ---------------------------------------------------------------------

NOW = 1_800_000_000.0


def decoded(body: dict[str, Any]) -> Claims:
    return msgspec.json.decode(json.dumps(body).encode(), type=Claims)


def kube(**over: Any) -> dict[str, Any]:
    base = claims(NOW)["kubernetes.io"]
    return {**base, **over}


def row(
    body: dict[str, Any],
    expected: str,
    *,
    account_uid: str | None = SA_UID,
    pod: tuple[str, str] | None = (POD, NODE),
    node_uid: str | None = NODE_UID,
) -> tuple[dict[str, Any], str, str | None, tuple[str, str] | None, str | None]:
    return body, expected, account_uid, pod, node_uid


def kclaims(**over: Any) -> dict[str, Any]:
    return claims(NOW, **{"kubernetes.io": kube(**over)})


@pytest.mark.parametrize(
    ("body", "expected", "account_uid", "pod", "node_uid"),
    [
        row(claims(NOW), "identity"),
        row(claims(NOW, aud="gpuhealth"), "identity"),
        row(claims(NOW, iss="https://other.example"), "issuer"),
        row(claims(NOW, aud=["api", "other"]), "audience"),
        row(claims(NOW, aud=[]), "audience"),
        row(claims(NOW, exp=NOW), "time"),
        row(claims(NOW, exp=None), "time"),
        row(claims(NOW, nbf=NOW + 1), "time"),
        row(claims(NOW, sub=f"system:serviceaccount:{NS}:default"), "account"),
        row(kclaims(namespace="x"), "account"),
        row(kclaims(serviceaccount={"name": "x", "uid": SA_UID}), "account"),
        row(claims(NOW, **{"kubernetes.io": None}), "account"),
        row(claims(NOW), "account_unconfirmed", account_uid=None),
        row(claims(NOW), "account_unconfirmed", account_uid="sa-uid-old"),
        row(kclaims(pod=None), "binding"),
        row(kclaims(node=None), "binding"),
        row(kclaims(node={"name": "", "uid": ""}), "binding", pod=(POD, "")),
        row(claims(NOW), "pod_unknown", pod=None),
        row(claims(NOW), "binding", pod=(POD, "gpu-2")),
        row(claims(NOW), "binding", pod=("agent-y", NODE)),
        # The Node of that name is another one now (deleted, made again), or not known:
        row(claims(NOW), "node", node_uid="node-uid-2"),
        row(claims(NOW), "node", node_uid=None),
        # A token without the node's UID (an older API server): the pod's node suffices.
        row(kclaims(node={"name": NODE}), "identity-no-node-uid", node_uid=None),
    ],
)
def test_vouch_table(
    body: dict[str, Any],
    expected: str,
    account_uid: str | None,
    pod: tuple[str, str] | None,
    node_uid: str | None,
) -> None:
    got = vouch(
        decoded({k: v for k, v in body.items() if v is not None}),
        NOW,
        issuer=ISSUER,
        audience="gpuhealth",
        namespace=NS,
        service_account=SA,
        account_uid=account_uid,
        pod=pod,
        node_uid=node_uid,
    )
    if expected == "identity-no-node-uid":
        extra = dict(REVIEWED.extra)
        del extra["authentication.kubernetes.io/node-uid"]
        assert got == replace(REVIEWED, extra=extra)
    elif expected == "identity":
        assert got == REVIEWED
        decision = authorize_agent(got, NODE, audience="gpuhealth", username=USERNAME)
        assert decision.ok
    else:
        assert got == expected


# -- the authenticator ---------------------------------------------------------------------


async def test_reviewed_once_then_verified_locally_while_the_account_is_trusted() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = make(clock)
    now = clock.now().timestamp()
    token = sign(claims(now))
    assert await auth.review(token) == REVIEWED  # no trust yet: the API server decides
    assert review.tokens == [token]
    other = sign(claims(now, jti="jti-2"))
    local = await auth.review(other)
    assert local.authenticated and local.extra["authentication.kubernetes.io/credential-id"] == (
        "JTI=jti-2",
    )
    assert review.tokens == [token]  # no second review
    clock.advance(10.0)  # the trust in the account's UID ends
    await auth.review(other)
    assert review.tokens == [token, other]
    assert counts == Counter({"review_account_unconfirmed": 2, "local": 1})


async def test_a_review_of_another_account_or_a_refusal_gives_no_trust() -> None:
    clock = FakeClock()
    for identity in (
        Identity(authenticated=False, error="nope"),
        replace(REVIEWED, username=f"system:serviceaccount:{NS}:default"),
        replace(REVIEWED, uid=""),
    ):
        auth, review, _, _, counts = make(clock, Review(identity))
        token = sign(claims(clock.now().timestamp()))
        await auth.review(token)
        await auth.review(token)
        assert len(review.tokens) == 2, identity
        assert counts == Counter({"review_account_unconfirmed": 2})


async def trusted(
    clock: FakeClock,
) -> tuple[BoundTokenAuthenticator, Review, Pods, Keys, Counter[str]]:
    parts = make(clock)
    await parts[0].review(sign(claims(clock.now().timestamp(), jti="warm")))
    parts[1].tokens.clear()
    parts[4].clear()
    return parts


async def test_a_signature_that_is_not_the_issuers_is_refused_without_a_review() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    forged = sign(claims(clock.now().timestamp()), key=OTHER_RSA, kid="rsa-1")
    identity = await auth.review(forged)
    assert not identity.authenticated and "signature" in identity.error
    # A valid token's payload with its signature from another token: also forged.
    real = sign(claims(clock.now().timestamp()))
    head, _, sig = real.split(".")
    _, payload, _ = sign(claims(clock.now().timestamp(), sub="x")).split(".")
    assert not (await auth.review(f"{head}.{payload}.{sig}")).authenticated
    assert review.tokens == []
    assert counts == Counter({"forged": 2})


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


async def test_what_cannot_be_decided_here_goes_to_the_review() -> None:
    clock = FakeClock()
    auth, review, pods, _, counts = await trusted(clock)
    now = clock.now().timestamp()
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs = f"{b64({'alg': 'HS256', 'kid': 'rsa-1'})}.{b64(claims(now))}"
    mac = hmac.new(public_pem, hs.encode(), hashlib.sha256).digest()
    cases = {
        "not_a_jwt": "opaque-token",
        "unknown_key": sign(claims(now), kid="rsa-2"),
        "algorithm": f"{hs}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}",
        "algorithm_none": f"{b64({'alg': 'none', 'kid': 'rsa-1'})}.{b64(claims(now))}.",
        "no_kid": jwt.encode(claims(now), RSA_KEY, algorithm="RS256"),
        "time": sign(claims(now, exp=now - 1)),
        "audience": sign(claims(now, aud=["https://kubernetes.default.svc"])),
        "pod_unknown": sign(claims(now, **{"kubernetes.io": kube(pod={"name": POD, "uid": "u2"})})),
        "es256_other_node": sign(
            claims(now, **{"kubernetes.io": kube(node={"name": "gpu-9", "uid": "n9"})}),
            key=EC_KEY,
            kid="ec-1",
            alg="ES256",
        ),
    }
    for name, token in cases.items():
        review.tokens.clear()
        identity = await auth.review(token)
        assert identity == REVIEWED, name  # the review's answer, whatever it is
        assert review.tokens == [token], name
    assert counts == Counter(
        {
            "review_not_a_jwt": 1,
            "review_unknown_key": 2,  # no kid at all counts as a key not published
            "review_algorithm": 2,  # HS256 with the public key as secret; "none"
            "review_time": 1,
            "review_audience": 1,
            "review_pod_unknown": 1,
            "review_binding": 1,
        }
    )
    # An EC key verifies as well as an RSA one.
    ok = sign(claims(now), key=EC_KEY, kid="ec-1", alg="ES256")
    assert (await auth.review(ok)).authenticated and counts["local"] == 1
    # The pod gone from the watch: the next token is the API server's to decide.
    pods.live.clear()
    review.tokens.clear()
    await auth.review(ok)
    assert review.tokens == [ok]


async def test_no_keys_sends_every_token_to_the_review() -> None:
    clock = FakeClock()
    auth, review, _, keys, counts = await trusted(clock)
    keys.key_set_value = None
    token = sign(claims(clock.now().timestamp()))
    await auth.review(token)
    assert review.tokens == [token] and counts == Counter({"review_no_keys": 1})


@settings(max_examples=300, deadline=None)
@given(
    token=st.one_of(
        st.text(max_size=300),
        st.builds(
            lambda a, b, c: f"{a}.{b}.{c}",
            st.text(alphabet="ABCDEFabcdef0123456789-_=", max_size=80),
            st.text(max_size=80),
            st.text(alphabet="ABCDEFabcdef0123456789-_", max_size=80),
        ),
        st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10)).map(
            lambda header: f"{b64(header)}.{b64(claims(NOW))}.c2ln"
        ),
    )
)
async def test_garbage_is_never_accepted_here(token: str) -> None:
    clock = FakeClock()
    auth, _, _, _, counts = make(clock, Review(Identity(authenticated=False)))
    identity = await auth.review(token)
    assert not identity.authenticated
    assert counts["local"] == 0


# -- the issuer's keys ---------------------------------------------------------------------


def test_only_public_signing_keys_are_kept() -> None:
    jwks = {
        "keys": [
            *JWKS["keys"],
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac", "alg": "HS256"},
            {**jwk(OTHER_RSA, "enc-1", "RS256"), "use": "enc"},
            {k: v for k, v in jwk(OTHER_RSA, "x", "RS256").items() if k != "kid"},
            {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
        ]
    }
    key_set = parse_key_set({"issuer": ISSUER, "jwks_uri": "x"}, jwks, 1.0)
    assert key_set.issuer == ISSUER and sorted(key_set.keys) == ["ec-1", "rsa-1"]
    with pytest.raises(ValueError):
        parse_key_set({}, jwks, 1.0)
    with pytest.raises(ValueError):
        parse_key_set({"issuer": ""}, jwks, 1.0)
    with pytest.raises(ValueError):
        parse_key_set({"issuer": ISSUER}, {"keys": "no"}, 1.0)


class FakeApi:
    """The two documents, served by a patched ``request``; ``fail`` makes it a 503."""

    def __init__(self) -> None:
        self.jwks: dict[str, Any] = {"keys": [jwk(RSA_KEY, "rsa-1", "RS256")]}
        self.fail = False
        self.gets: list[str] = []

    async def request(self, api: object, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.gets.append(path)
        if self.fail:
            raise TransientKubeError(f"{method} {path}: HTTP 503", 503)
        return {"issuer": ISSUER} if path == issuer_keys.DISCOVERY_PATH else self.jwks


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeApi, FakeClock, IssuerKeys]:
    """The keys of a fake API server: fetched again after 60 s, or 5 s for an unknown ID."""
    fake, clock = FakeApi(), FakeClock()
    monkeypatch.setattr(issuer_keys, "request", fake.request)
    return fake, clock, IssuerKeys(object(), clock, max_age_s=60.0, unknown_key_refetch_s=5.0)


async def test_the_keys_are_fetched_when_missing_old_or_lacking_a_key_id(
    api: tuple[FakeApi, FakeClock, IssuerKeys],
) -> None:
    fake, clock, keys = api
    first = await keys.key_set("rsa-1")
    assert first is not None and list(first.keys) == ["rsa-1"] and keys.fetches == 1
    await keys.key_set("rsa-1")
    assert keys.fetches == 1  # fresh and known: no fetch
    fake.jwks = JWKS
    assert await keys.key_set("ec-1") is first  # unknown, but fetched < 5 s ago
    clock.advance(5.0)
    got = await keys.key_set("ec-1")  # unknown: fetched again
    assert got is not None and "ec-1" in got.keys and keys.fetches == 2
    await keys.key_set("nope")
    assert keys.fetches == 2  # a stream of unknown IDs does not hammer the API server
    clock.advance(60.0)
    await keys.key_set("rsa-1")  # too old: fetched again
    assert keys.fetches == 3
    # A failed fetch of old keys leaves none (not trusted past their age) ...
    fake.fail = True
    clock.advance(60.0)
    assert await keys.key_set("rsa-1") is None and keys.failures == 1
    assert await keys.key_set("rsa-1") is None and keys.fetches == 4  # ... retried after 5 s
    clock.advance(5.0)
    fake.fail = False
    assert await keys.key_set("rsa-1") is not None and keys.fetches == 5


async def test_a_failed_fetch_for_an_unknown_key_keeps_the_fresh_keys(
    api: tuple[FakeApi, FakeClock, IssuerKeys],
) -> None:
    fake, clock, keys = api
    first = await keys.key_set("rsa-1")
    fake.fail = True
    clock.advance(6.0)
    assert await keys.key_set("other") is first and keys.failures == 1


async def test_concurrent_callers_share_one_fetch(
    api: tuple[FakeApi, FakeClock, IssuerKeys],
) -> None:
    fake, _, keys = api
    results = await asyncio.gather(*(keys.key_set("rsa-1") for _ in range(20)))
    assert keys.fetches == 1 and len({id(r) for r in results}) == 1
    assert fake.gets == [issuer_keys.DISCOVERY_PATH, issuer_keys.JWKS_PATH]


async def test_a_token_of_a_node_made_again_goes_to_the_review() -> None:
    clock = FakeClock()
    auth, review, pods, _, counts = await trusted(clock)
    token = sign(claims(clock.now().timestamp()))
    pods.nodes[NODE] = "node-uid-2"
    await auth.review(token)
    assert review.tokens == [token] and counts == Counter({"review_node": 1})


async def test_a_steady_stream_of_agents_renews_the_trust_with_one_review() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)  # trusted for 10 s
    now = clock.now().timestamp()
    tokens = [sign(claims(now, jti=f"j{i}")) for i in range(40)]
    for token in tokens[:20]:  # 4.75 s: within the first half, all here
        await auth.review(token)
        clock.advance(0.25)
    assert review.tokens == [] and counts == Counter({"local": 20})
    for token in tokens[20:]:  # past the half: one renewal, the rest here
        await auth.review(token)
        clock.advance(0.25)
    assert review.tokens == [tokens[20]]  # renewed at 5 s: due again at 10 s
    assert counts == Counter({"local": 39, "review_renewal": 1})
    clock.advance(5.0)  # 15 s: the renewed trust (until 15 s) has ended
    await auth.review(tokens[0])
    assert counts["review_account_unconfirmed"] == 1


async def test_a_renewal_the_api_server_refuses_ends_the_trust() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    token = sign(claims(clock.now().timestamp()))
    clock.advance(5.0)
    review.identity = Identity(authenticated=False, error="service account deleted")
    assert not (await auth.review(token)).authenticated
    assert counts == Counter({"review_renewal": 1})
    # Nothing is verified here until a review confirms the account again.
    assert not (await auth.review(token)).authenticated
    assert counts["review_account_unconfirmed"] == 1 and len(review.tokens) == 2


async def test_one_renewal_at_a_time() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    gate = asyncio.Event()
    inner = review.review

    async def slow(token: str) -> Identity:
        await gate.wait()
        return await inner(token)

    review.review = slow  # type: ignore[method-assign]
    clock.advance(6.0)
    now = clock.now().timestamp()
    renewal = asyncio.create_task(auth.review(sign(claims(now, jti="r"))))
    await asyncio.sleep(0)
    others = [await auth.review(sign(claims(now, jti=f"o{i}"))) for i in range(5)]
    assert all(o.authenticated for o in others) and counts["local"] == 5
    gate.set()
    assert (await renewal).authenticated and counts["review_renewal"] == 1


async def test_a_renewal_the_api_server_cannot_answer_leaves_the_trust_to_decide() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    clock.advance(6.0)

    async def down(token: str) -> Identity:
        review.tokens.append(token)
        raise AuthUnavailable("TokenReview failed: HTTP 503")

    review.review = down  # type: ignore[method-assign]
    token = sign(claims(clock.now().timestamp()))
    assert (await auth.review(token)).authenticated  # verified here, trust still good
    assert (await auth.review(token)).authenticated  # the next one tries the renewal again
    assert counts == Counter({"review_renewal": 2}) and len(review.tokens) == 2
    clock.advance(4.0)  # the trust ends: the API server must decide, and cannot
    with pytest.raises(AuthUnavailable):
        await auth.review(token)


def gated(review: Review, slow: set[str]) -> asyncio.Event:
    """The reviews of the ``slow`` tokens wait for the returned gate (an API server slow in a
    storm); the others are answered at once."""
    gate = asyncio.Event()
    inner = review.review

    async def maybe_slow(token: str) -> Identity:
        if token in slow:
            await gate.wait()
        return await inner(token)

    review.review = maybe_slow  # type: ignore[method-assign]
    return gate


async def test_a_trust_that_ends_during_a_renewal_waits_for_it_not_one_review_per_agent() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    clock.advance(6.0)  # past half of the trust: the next token renews it
    renewing = sign(claims(clock.now().timestamp(), jti="renewal"))
    gate = gated(review, {renewing})
    renewal = asyncio.create_task(auth.review(renewing))
    await asyncio.sleep(0)
    clock.advance(5.0)  # 11 s: the trust has ended, its renewal still unanswered
    now = clock.now().timestamp()
    agents = [asyncio.create_task(auth.review(sign(claims(now, jti=f"a{i}")))) for i in range(10)]
    await asyncio.sleep(0)
    assert review.tokens == [] and not any(a.done() for a in agents)
    # A token of another account does not wait: the API server decides it at once.
    review.identity = Identity(authenticated=False, error="not the agent's")
    other = sign(claims(now, sub=f"system:serviceaccount:{NS}:default"))
    assert not (await auth.review(other)).authenticated
    review.identity = REVIEWED
    assert review.tokens == [other] and not any(a.done() for a in agents)
    gate.set()
    assert (await renewal).authenticated
    assert all(i.authenticated for i in await asyncio.gather(*agents))
    assert review.tokens == [other, renewing]  # one review renewed the trust for all ten
    assert counts == Counter({"review_renewal": 1, "local": 10, "review_account": 1})


async def test_agents_that_find_no_trust_wait_for_the_first_ones_review() -> None:
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    clock.advance(11.0)  # the trust has ended, nothing renewed it
    now = clock.now().timestamp()
    tokens = [sign(claims(now, jti=f"a{i}")) for i in range(6)]
    gate = gated(review, {tokens[0]})
    first = asyncio.create_task(auth.review(tokens[0]))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(auth.review(t)) for t in tokens[1:]]
    await asyncio.sleep(0)
    assert review.tokens == [] and not any(r.done() for r in rest)
    gate.set()
    assert all(i.authenticated for i in await asyncio.gather(first, *rest))
    assert review.tokens == [tokens[0]]
    assert counts == Counter({"review_account_unconfirmed": 1, "local": 5})


async def test_a_confirmation_refused_sends_each_waiter_to_its_own_review_once() -> None:
    """The account was deleted: the one review in flight is refused, and every agent that
    waited for it is decided by the API server itself (refused too), not trusted, not
    waiting again."""
    clock = FakeClock()
    auth, review, _, _, counts = await trusted(clock)
    clock.advance(11.0)
    review.identity = Identity(authenticated=False, error="service account deleted")
    now = clock.now().timestamp()
    tokens = [sign(claims(now, jti=f"a{i}")) for i in range(4)]
    gate = gated(review, {tokens[0]})
    tasks = [asyncio.create_task(auth.review(t)) for t in tokens]
    await asyncio.sleep(0)
    assert review.tokens == []
    gate.set()
    assert not any(i.authenticated for i in await asyncio.gather(*tasks))
    assert sorted(review.tokens) == sorted(tokens)
    assert counts == Counter({"review_account_unconfirmed": 4})


async def test_a_waiter_cancelled_leaves_the_confirmation_to_the_others() -> None:
    clock = FakeClock()
    auth, review, _, _, _ = await trusted(clock)
    clock.advance(11.0)
    now = clock.now().timestamp()
    tokens = [sign(claims(now, jti=f"a{i}")) for i in range(3)]
    gate = gated(review, {tokens[0]})
    tasks = [asyncio.create_task(auth.review(t)) for t in tokens]
    await asyncio.sleep(0)
    tasks[1].cancel()  # that agent went away while it waited
    await asyncio.sleep(0)
    gate.set()
    assert (await tasks[0]).authenticated and (await tasks[2]).authenticated
    assert tasks[1].cancelled() and review.tokens == [tokens[0]]
