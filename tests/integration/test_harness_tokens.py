"""Issue 2, test 2: a pod-bound ServiceAccount token carries the node name to TokenReview."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuhealth.controller.kube.client import make_api_client
from localkube import ControlPlane
from localkube.controlplane import SERVICE_ACCOUNT_ISSUER
from localkube.objects import (
    create_gpu_node,
    create_namespace,
    create_pod,
    create_service_account,
    request_bound_token,
)

pytestmark = pytest.mark.integration

AUDIENCE = "gpuhealth"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"


async def _review(api: client.ApiClient, token: str, audience: str) -> client.V1TokenReviewStatus:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": [audience]},
    }
    review = await client.AuthenticationV1Api(api).create_token_review(body)
    return review.status


async def test_bound_token_review_names_the_node(
    api_client: client.ApiClient,
    control_plane: ControlPlane,
    unique_name: Callable[[str], str],
) -> None:
    core = client.CoreV1Api(api_client)
    node_name, ns, sa = unique_name("gpu"), unique_name("ns"), "gpuhealth-agent"
    await create_gpu_node(api_client, node_name, kwok=False)
    try:
        await create_namespace(api_client, ns)
        await create_service_account(api_client, ns, sa)
        pod = await create_pod(api_client, ns, "agent", node_name=node_name, service_account=sa)

        token = await request_bound_token(api_client, ns, sa, pod, AUDIENCE)
        status = await _review(api_client, token, AUDIENCE)

        assert status.authenticated is True, status.error
        assert status.user.username == f"system:serviceaccount:{ns}:{sa}"
        assert status.user.extra[NODE_NAME_KEY] == [node_name]
        assert status.user.extra[POD_NAME_KEY] == ["agent"]
        assert AUDIENCE in status.audiences

        # The audience is checked: the same token is no good for anyone else.
        other = await _review(api_client, token, "someone-else")
        assert not other.authenticated

        # A gpuhealth-audience token is no credential for the apiserver itself (401); one
        # for the apiserver's audience is the ServiceAccount, which RBAC grants nothing (403).
        api_token = await request_bound_token(api_client, ns, sa, pod, SERVICE_ACCOUNT_ISSUER)
        for credential, status_code in ((token, 401), (api_token, 403)):
            agent = await make_api_client(str(control_plane.token_kubeconfig(credential, sa)))
            try:
                with pytest.raises(ApiException) as refused:
                    await client.CoreV1Api(agent).list_node()
                assert refused.value.status == status_code
            finally:
                await agent.close()

        # The binding is checked: once the pod is gone, its tokens are refused. (A token
        # that was already reviewed stays accepted for the apiserver's ~10 s token cache,
        # so this uses a fresh one.)
        unseen = await request_bound_token(api_client, ns, sa, pod, AUDIENCE)
        await core.delete_namespaced_pod("agent", ns, grace_period_seconds=0)
        gone = await _review(api_client, unseen, AUDIENCE)
        assert not gone.authenticated
        assert "invalidated" in (gone.error or "")
    finally:
        await core.delete_node(node_name)
