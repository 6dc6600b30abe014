"""A stand-in for Karpenter in the demo: its CRDs, a NodePool, the NodeClaim of each of the pool's
kwok nodes, and what Karpenter does once gpuhealth deletes a NodeClaim: the Node goes (Karpenter
drains and terminates it) and a new NodeClaim and Node take its place.

The CRDs are ``localkube/crds/karpenter`` (``karpenter.sh/v1``). gpuhealth finds a node's
NodeClaim as it would on a real cluster: the Node's ownerReference, the NodeClaim's
``status.nodeName`` and its ``karpenter.sh/nodepool`` label.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ConflictError,
    KubeError,
    NotFoundError,
    request,
)
from localkube.crds import karpenter_crds
from localkube.objects import gpu_node_body, wait_for

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
POOL_LABEL = "karpenter.sh/nodepool"
NODE_CLASS = {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "demo"}
REQUIREMENTS = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]
REQUEST_TIMEOUT_S = 10.0
POLL_S = 1.0
"""How often the stand-in looks for a NodeClaim gpuhealth deleted."""
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


async def install(api: Any, pool: str) -> None:
    """The CRDs (served before anything uses them) and the NodePool."""
    for crd in karpenter_crds():
        with contextlib.suppress(ConflictError):
            await request(api, "POST", CRD_PATH, body=crd, timeout_s=REQUEST_TIMEOUT_S)

    async def served() -> bool:
        try:
            await request(api, "GET", NODEPOOLS, timeout_s=REQUEST_TIMEOUT_S)
            await request(api, "GET", NODECLAIMS, timeout_s=REQUEST_TIMEOUT_S)
        except KubeError:
            return False
        return True

    await wait_for(served, what="the Karpenter CRDs served", timeout_s=30)
    body = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool},
        "spec": {
            "template": {
                "metadata": {"labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {"nodeClassRef": NODE_CLASS, "requirements": REQUIREMENTS},
            },
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized"},
        },
    }
    with contextlib.suppress(ConflictError):
        await request(api, "POST", NODEPOOLS, body=body, timeout_s=REQUEST_TIMEOUT_S)


async def launch(api: Any, node: str, pool: str, gpus: int) -> str:
    """A NodeClaim of ``pool`` and the kwok GPU Node it registered as (the pool's label, owned
    by the NodeClaim), as Karpenter makes them; returns the NodeClaim's name."""
    claim = f"{pool}-{node}"
    body = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": claim, "labels": {POOL_LABEL: pool}},
        "spec": {"nodeClassRef": NODE_CLASS, "requirements": REQUIREMENTS},
    }
    created = await request(api, "POST", NODECLAIMS, body=body, timeout_s=REQUEST_TIMEOUT_S)
    node_body = gpu_node_body(node, gpus=gpus, labels={POOL_LABEL: pool})
    node_body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "name": claim,
            "uid": created["metadata"]["uid"],
            "blockOwnerDeletion": True,
        }
    ]
    await request(api, "POST", "/api/v1/nodes", body=node_body, timeout_s=REQUEST_TIMEOUT_S)
    status = {"status": {"nodeName": node, "providerID": f"kwok://{node}"}}
    await request(
        api,
        "PATCH",
        f"{NODECLAIMS}/{claim}/status",
        body=status,
        content_type=MERGE_PATCH,
        timeout_s=REQUEST_TIMEOUT_S,
    )
    return claim


class KarpenterStandIn:
    """Watches the pool's NodeClaims; one that gpuhealth deleted gets Karpenter's answer."""

    def __init__(
        self,
        api: Any,
        pool: str,
        gpus: int,
        claims: dict[str, str],
        say: Callable[[str], None],
        *,
        guarded: Callable[[str], None] = lambda _node: None,
    ) -> None:
        """``claims``: NodeClaim -> its node; ``guarded``: told of a node that carried
        ``karpenter.sh/do-not-disrupt: "true"`` when its NodeClaim was found deleted (the
        whole escalation and replacement can pass between two of the demo's polls)."""
        self._api = api
        self._pool = pool
        self._gpus = gpus
        self._claims = dict(claims)
        self._say = say
        self._guarded = guarded
        self.replaced: dict[str, str] = {}
        """Node -> the node that replaced it."""

    async def run(self) -> None:
        while True:
            for claim, node in list(self._claims.items()):
                try:
                    await request(
                        self._api, "GET", f"{NODECLAIMS}/{claim}", timeout_s=REQUEST_TIMEOUT_S
                    )
                except NotFoundError:
                    await self._replace(claim, node)
            await asyncio.sleep(POLL_S)

    async def _replace(self, claim: str, node: str) -> None:
        del self._claims[claim]
        self._say(f"karpenter (stand-in): NodeClaim {claim} deleted -> draining {node}")
        with contextlib.suppress(NotFoundError):
            obj = await request(
                self._api, "GET", f"/api/v1/nodes/{node}", timeout_s=REQUEST_TIMEOUT_S
            )
            if (obj["metadata"].get("annotations") or {}).get(DO_NOT_DISRUPT) == "true":
                self._guarded(node)
        with contextlib.suppress(NotFoundError):
            await request(self._api, "DELETE", f"/api/v1/nodes/{node}", timeout_s=REQUEST_TIMEOUT_S)
        new = f"{node}-r"
        new_claim = await launch(self._api, new, self._pool, self._gpus)
        self._claims[new_claim] = new
        self.replaced[node] = new
        self._say(
            f"karpenter (stand-in): {node} terminated; NodeClaim {new_claim} launched, "
            f"node {new} registered"
        )
