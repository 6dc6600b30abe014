"""What a node's own identity can and cannot do, against the real kube-apiserver with the
Node authorizer and NodeRestriction on (as localkube and managed clusters run it).

The identity is the one a kubelet has: user ``system:node:<name>`` in group
``system:nodes``, a client certificate of the cluster's CA
(``ControlPlane.node_kubeconfig``, the ``node_api_client`` fixture). On its own Node it
cannot remove, change or add taints, nor set or remove labels under
``node-restriction.kubernetes.io/``, nor delete the Node; it CAN set other labels
(``gpuhealth.io/exclude``, ``gpuhealth.io/remediation=disabled``), annotations
(``gpuhealth.io/acknowledged-taints``) and status conditions (``GPUHealthy``) — which is
why operator overrides must not live there (issue 38, item 5). Another Node it cannot read,
write or delete, nor any GPURemediation or GPUIncident. These are the baseline the move of
operator overrides to places a kubelet cannot write builds on. The keys are written out here
as the controller names them (``gpuhealth.io`` is its default prefix).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    STRATEGIC_PATCH,
    KubeError,
    PermanentKubeError,
    request,
)
from localkube.objects import gpu_node_body
from tests.integration.remediation_helpers import install_crd

pytestmark = pytest.mark.integration

TAINT = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
"""A hard taint gpuhealth wrote on the node."""
EXCLUDE = "gpuhealth.io/exclude"
OPT_OUT = "gpuhealth.io/remediation"
ACKNOWLEDGED = "gpuhealth.io/acknowledged-taints"
RESTRICTED = "node-restriction.kubernetes.io/gpuhealth.io-exclude"
"""A label under the prefix NodeRestriction keeps from kubelets: where an operator's
override can live."""
EPISODES = "/apis/gpuhealth.io/v1alpha1/gpuremediations"

NodeApi = Callable[[str], Awaitable[Any]]


async def _node(api: Any, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = gpu_node_body(name, kwok=False, taints=[TAINT], labels=labels)
    return await request(api, "POST", "/api/v1/nodes", body=body)


async def _patch(api: Any, node: str, body: dict[str, Any]) -> dict[str, Any]:
    return await request(api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)


async def _refused(call: Awaitable[Any]) -> KubeError:
    """``call`` is refused with 403 Forbidden (the authorizer or NodeRestriction)."""
    with pytest.raises(PermanentKubeError) as caught:
        await call
    assert caught.value.status == 403, caught.value
    return caught.value


@pytest.fixture
async def own(api_client: Any, unique_name: Callable[[str], str]) -> AsyncIterator[str]:
    """A Node carrying gpuhealth's hard taint, created by the admin (deleted afterwards: a
    later test's controller counts every GPU node of the shared API server)."""
    name = unique_name("own")
    await _node(api_client, name, labels={RESTRICTED: "true"})
    yield name
    with contextlib.suppress(KubeError):
        await request(api_client, "DELETE", f"/api/v1/nodes/{name}")


async def test_a_node_cannot_remove_the_taint_on_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    node = await node_api_client(own)
    err = await _refused(_patch(node, own, {"spec": {"taints": []}}))
    assert "not allowed to modify taints" in str(err)
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert current["spec"]["taints"] == [TAINT]


async def test_a_node_cannot_change_or_add_a_taint_on_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    node = await node_api_client(own)
    softer = {**TAINT, "effect": "PreferNoSchedule"}
    await _refused(_patch(node, own, {"spec": {"taints": [softer]}}))
    other_value = {**TAINT, "value": "cleared"}
    await _refused(_patch(node, own, {"spec": {"taints": [other_value]}}))
    extra = {"key": "example.com/mine", "effect": "NoSchedule"}
    await _refused(_patch(node, own, {"spec": {"taints": [TAINT, extra]}}))
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert current["spec"]["taints"] == [TAINT]


async def test_a_node_cannot_set_or_remove_node_restriction_labels_on_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    node = await node_api_client(own)
    err = await _refused(
        _patch(node, own, {"metadata": {"labels": {"node-restriction.kubernetes.io/x": "1"}}})
    )
    assert "node-restriction.kubernetes.io/x" in str(err)
    # the one the admin set stays: the node can neither remove nor change it
    await _refused(_patch(node, own, {"metadata": {"labels": {RESTRICTED: None}}}))
    await _refused(_patch(node, own, {"metadata": {"labels": {RESTRICTED: "false"}}}))
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert current["metadata"]["labels"][RESTRICTED] == "true"
    assert "node-restriction.kubernetes.io/x" not in current["metadata"]["labels"]


async def test_a_node_can_set_other_labels_on_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    """The exclude label and the remediation opt-out are accepted from the node itself."""
    node = await node_api_client(own)
    labels = {EXCLUDE: "true", OPT_OUT: "disabled"}
    await _patch(node, own, {"metadata": {"labels": labels}})
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert {k: current["metadata"]["labels"].get(k) for k in labels} == labels
    assert current["spec"]["taints"] == [TAINT]  # the taint itself is still there


async def test_a_node_can_annotate_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    """Its own taint written into the acknowledged-taints annotation is accepted."""
    node = await node_api_client(own)
    ack = json.dumps([f"{TAINT['key']}:{TAINT['effect']}"])
    await _patch(node, own, {"metadata": {"annotations": {ACKNOWLEDGED: ack}}})
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert current["metadata"]["annotations"][ACKNOWLEDGED] == ack


async def test_a_node_cannot_touch_another_node(
    api_client: Any, node_api_client: NodeApi, own: str, unique_name: Callable[[str], str]
) -> None:
    other = unique_name("other")
    await _node(api_client, other)
    node = await node_api_client(own)
    await request(node, "GET", f"/api/v1/nodes/{own}")  # its own it reads
    await _refused(request(node, "GET", f"/api/v1/nodes/{other}"))
    await _refused(_patch(node, other, {"metadata": {"labels": {EXCLUDE: "true"}}}))
    await _refused(_patch(node, other, {"metadata": {"annotations": {ACKNOWLEDGED: "[]"}}}))
    await _refused(_patch(node, other, {"spec": {"taints": []}}))
    await _refused(request(node, "DELETE", f"/api/v1/nodes/{other}"))
    current = await request(api_client, "GET", f"/api/v1/nodes/{other}")
    assert current["spec"]["taints"] == [TAINT]
    assert EXCLUDE not in current["metadata"]["labels"]
    assert ACKNOWLEDGED not in current["metadata"].get("annotations", {})
    await request(api_client, "DELETE", f"/api/v1/nodes/{other}")


async def test_a_node_cannot_read_or_write_gpuremediations(
    api_client: Any, node_api_client: NodeApi, own: str, unique_name: Callable[[str], str]
) -> None:
    """Not even an episode about itself: no create, read, list, change or delete."""
    await install_crd(api_client)
    node = await node_api_client(own)
    name = unique_name("episode")
    episode = {
        "apiVersion": "gpuhealth.io/v1alpha1",
        "kind": "GPURemediation",
        "metadata": {"name": name},
        "spec": {
            "nodeName": own,
            "action": "reset-gpu",
            "scope": "gpu",
            "fault": {
                "fingerprint": "0123456789abcdef",
                "bootId": "boot-1",
                "detectedAt": "2026-01-01T00:00:00Z",
                "gpus": [{"uuid": "GPU-0", "index": 0, "code": "xid-48"}],
            },
        },
    }
    await _refused(request(node, "POST", EPISODES, body=episode))
    await request(api_client, "POST", EPISODES, body=episode)  # the same body is valid
    await _refused(request(node, "GET", EPISODES))
    await _refused(request(node, "GET", f"{EPISODES}/{name}"))
    status = {"status": {"phase": "Failed", "reason": "Aborted"}}
    await _refused(
        request(node, "PATCH", f"{EPISODES}/{name}/status", body=status, content_type=MERGE_PATCH)
    )
    await _refused(request(node, "DELETE", f"{EPISODES}/{name}"))
    kept = await request(api_client, "GET", f"{EPISODES}/{name}")
    assert "status" not in kept or kept["status"].get("phase") != "Failed"


async def test_a_node_cannot_delete_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    """Deleted and registered again it would come back without the taint: it cannot."""
    node = await node_api_client(own)
    await _refused(request(node, "DELETE", f"/api/v1/nodes/{own}"))
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    assert current["spec"]["taints"] == [TAINT]


async def test_a_node_can_write_the_gpuhealthy_condition_of_its_own_node(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    """nodes/status is the kubelet's to write: a condition the controller writes there (it
    writes it again when it differs from its verdict) is not a place for a decision."""
    node = await node_api_client(own)
    forged = {"type": "GPUHealthy", "status": "True", "reason": "Forged", "message": "by the node"}
    await request(
        node,
        "PATCH",
        f"/api/v1/nodes/{own}/status",
        body={"status": {"conditions": [forged]}},
        content_type=STRATEGIC_PATCH,
    )
    current = await request(api_client, "GET", f"/api/v1/nodes/{own}")
    conditions = {c["type"]: c for c in current["status"].get("conditions", [])}
    assert conditions["GPUHealthy"]["reason"] == "Forged"
    assert current["spec"]["taints"] == [TAINT]


async def test_the_identity_is_the_kubelets(node_api_client: NodeApi, own: str) -> None:
    """The kubeconfig authenticates as ``system:node:<name>`` in ``system:nodes``, and it
    reads its own Node only."""
    node = await node_api_client(own)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    me = await request(
        node, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review
    )
    info = me["status"]["userInfo"]
    assert info["username"] == f"system:node:{own}"
    assert "system:nodes" in info["groups"]
    await _refused(request(node, "GET", "/api/v1/nodes"))  # not the whole list
    mine = await request(
        node, "GET", "/api/v1/nodes", query=[("fieldSelector", f"metadata.name={own}")]
    )
    assert [n["metadata"]["name"] for n in mine["items"]] == [own]


async def test_a_node_cannot_read_or_write_gpuincidents(
    api_client: Any, node_api_client: NodeApi, own: str
) -> None:
    """Not its own override or its domain's incident: no create, read, list, lifecycle edit or
    delete (the Node authorizer grants nodes nothing on gpuhealth's resources)."""
    await install_crd(api_client)
    node = await node_api_client(own)
    incidents = "/apis/gpuhealth.io/v1alpha1/gpuincidents"
    name = "override-0123456789ab"
    body = {
        "apiVersion": "gpuhealth.io/v1alpha1",
        "kind": "GPUIncident",
        "metadata": {"name": name},
        "spec": {},
    }
    await _refused(request(node, "POST", incidents, body=body))
    await _refused(request(node, "GET", incidents))
    await _refused(request(node, "GET", f"{incidents}/{name}"))
    resolve = {
        "spec": {
            "lifecycle": {
                "resolved": {
                    "by": f"system:node:{own}",
                    "at": "2026-01-01T00:00:00Z",
                    "reason": "x",
                }
            }
        }
    }
    await _refused(
        request(node, "PATCH", f"{incidents}/{name}", body=resolve, content_type=MERGE_PATCH)
    )
    await _refused(request(node, "DELETE", f"{incidents}/{name}"))
