"""Agents' bound tokens verified by the controller itself, against the real kube-apiserver:
the issuer's keys read with the chart's controller identity, the same identity a TokenReview
gives, one TokenReview to trust the agent ServiceAccount and none for the agents after it,
and a forged or misbound token refused."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable

import jwt
import pytest
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import rsa

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.app import Controller
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.stream.bound_tokens import BoundTokenAuthenticator, TokenFacts
from gpuhealth.controller.stream.issuer_keys import IssuerKeys
from gpuhealth.controller.stream.token_review import TokenReviewAuthenticator
from gpuhealth.protocol import Ack, Error, ErrorCode
from localkube import ControlPlane
from localkube.objects import gpu_node_body
from tests.integration.controller_helpers import Cluster, cluster
from tests.integration.test_token_revocation import connect
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def claims_of(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(payload + "=" * 4))
    return decoded


async def test_agents_tokens_are_verified_here_after_one_review(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    nodes = [await kube.node(unique_name("gpu")) for _ in range(4)]
    agents = [await kube.agent(node) for node in nodes]
    ctl: Controller = await kube.controller()
    pods = ctl.parts.agent_pods
    assert pods is not None
    for pod, _ in agents:
        uid = pod.metadata.uid
        await until(lambda uid=uid: pods.bound(uid) is not None, "the agent pods watched")
    server = TestServer(ctl.web_app(), host="127.0.0.1", port=0)
    await server.start_server()
    url = f"ws://127.0.0.1:{server.port}/v1/stream"
    sessions = []
    tokens = ctl.parts.stream.metrics.tokens
    try:
        for (_, token), node in zip(agents[:3], nodes, strict=False):
            http, _, reply = await connect(url, token, node)
            sessions.append(http)
            assert reply == Ack(seq=0), node
        # The first agent's TokenReview confirmed the account; the next two were verified here
        # (the chart's controller identity read the issuer's keys).
        assert tokens == Counter({"review_account_unconfirmed": 1, "local": 2})

        # A valid token presented for another node: verified, then refused by the policy.
        http, _, reply = await connect(url, agents[3][1], nodes[0])
        sessions.append(http)
        assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN
        assert ctl.parts.stream.metrics.rejected["node_mismatch"] == 1

        # The fourth agent's claims signed with another key under the issuer's key ID: forged,
        # refused without asking the API server.
        real = agents[3][1]
        header = jwt.get_unverified_header(real)
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode(claims_of(real), other, algorithm="RS256", headers=header)
        http, _, reply = await connect(url, forged, nodes[3])
        sessions.append(http)
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNAUTHENTICATED
        assert tokens["forged"] == 1 and tokens["local"] == 3

        # A token for another audience goes to the API server, which refuses it for ours.
        pod, wrong_audience = await (await kube.release()).agent(kube.api, nodes[3], "other")
        await until(lambda: pods.bound(pod.metadata.uid) is not None, "the pod watched")
        http, _, reply = await connect(url, wrong_audience, nodes[3])
        sessions.append(http)
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNAUTHENTICATED
        assert tokens["review_audience"] == 1
        assert ctl.parts.stream.metrics.rejected["unauthenticated"] == 2
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
        await server.close()


async def test_the_identity_verified_here_is_the_one_a_token_review_gives(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    release = await kube.release()
    nodes = [await kube.node(unique_name("gpu")) for _ in range(2)]
    (_, first), (_, second) = [await kube.agent(node) for node in nodes]
    ctl: Controller = await kube.controller()
    pods = ctl.parts.agent_pods
    assert pods is not None
    await asyncio.wait_for(pods.watch.synced.wait(), 15)
    clock = SystemClock()
    review = TokenReviewAuthenticator(kube.api, "gpuhealth")
    counts: Counter[str] = Counter()
    keys = IssuerKeys(kube.api, clock, max_age_s=60.0, unknown_key_refetch_s=5.0)
    local = BoundTokenAuthenticator(
        TokenFacts(keys, ctl.parts.cache.uid),
        pods,
        review,
        clock,
        audience="gpuhealth",
        namespace=release.namespace,
        service_account=release.agent_service_account,
        trust_s=10.0,
        counts=counts,
    )
    await local.review(first)  # trusts the account
    here = await local.review(second)
    assert counts == Counter({"review_account_unconfirmed": 1, "local": 1})
    reviewed = await review.review(second)
    assert reviewed.authenticated
    assert here == reviewed


async def test_a_token_naming_a_node_made_again_is_the_api_servers_to_decide(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """A Node deleted and made again under the same name while its agent pod stays: the
    token names the old Node's UID. The controller does not decide it; the API server does
    (1.36 checks a Node's UID only in tokens bound to the Node itself, and accepts it)."""
    node = await kube.node(unique_name("gpu"))
    pod, token = await kube.agent(node)
    other_node = await kube.node(unique_name("gpu"))
    _, other = await kube.agent(other_node)
    ctl: Controller = await kube.controller()
    pods = ctl.parts.agent_pods
    assert pods is not None
    await until(lambda: pods.bound(pod.metadata.uid) is not None, "the agent pod watched")
    old_uid = ctl.parts.cache.uid(node)
    assert old_uid == claims_of(token)["kubernetes.io"]["node"]["uid"]  # type: ignore[index]
    await request(kube.api, "DELETE", f"/api/v1/nodes/{node}")
    await request(kube.api, "POST", "/api/v1/nodes", body=gpu_node_body(node, gpus=2))
    await until(lambda: ctl.parts.cache.uid(node) not in (None, old_uid), "the new Node watched")
    server = TestServer(ctl.web_app(), host="127.0.0.1", port=0)
    await server.start_server()
    url = f"ws://127.0.0.1:{server.port}/v1/stream"
    tokens = ctl.parts.stream.metrics.tokens
    try:
        http, _, first = await connect(url, other, other_node)  # trusts the account
        await http.close()
        assert first == Ack(seq=0)
        http, _, reply = await connect(url, token, node)
        await http.close()
        assert tokens["review_node"] == 1
        reviewed = await TokenReviewAuthenticator(kube.api, "gpuhealth").review(token)
        assert reviewed.authenticated and reply == Ack(seq=0)  # the API server's answer
    finally:
        await server.close()
