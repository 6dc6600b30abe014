"""The runner's :class:`~gpuhealth.controller.remediation.ports.NodeReplacer`: deletes an escalated
node's Karpenter NodeClaim, or its Node, after reading it again.

Right before the delete the target is read again and checked against what the episode recorded
(``gpuhealth.controller.remediation.replacing``): the Node still has the recorded UID (a Node
made again under the name is another node); a NodeClaim still has its UID, names the node in
``status.nodeName`` and carries the node's pool in ``karpenter.sh/nodepool`` (the NodeClaim's
labels, which the node's own kubelet cannot write); a Node to delete is still cordoned. The
delete carries the UID as a precondition, so an object replaced in between answers 409 and is
left alone. Nothing else is ever deleted. RBAC: ``get, delete`` on ``karpenter.sh``
``nodeclaims``, ``delete`` on ``nodes``, each only with a pool that uses that method (the
chart's ``remediation.replace``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gpuhealth.controller.kube.rest import ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.names import (
    KARPENTER_NODEPOOL_LABEL,
    NODECLAIM_API_VERSION,
    NODECLAIM_KIND,
    NODECLAIM_PLURAL,
)
from gpuhealth.controller.remediation.actions import ReplaceNode
from gpuhealth.controller.remediation.outcomes import ReplaceOutcome

NODECLAIMS = f"/apis/{NODECLAIM_API_VERSION}/{NODECLAIM_PLURAL}"


def nodeclaim_mismatch(claim: dict[str, Any], act: ReplaceNode) -> str:
    """Why the NodeClaim read again is not the one to delete ("" when it is)."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    pool = (meta.get("labels") or {}).get(KARPENTER_NODEPOOL_LABEL)
    if act.node_claim_uid and meta.get("uid") != act.node_claim_uid:
        return f"{NODECLAIM_KIND} {act.node_claim} has another UID now"
    if status.get("nodeName") != act.node:
        return (
            f"{NODECLAIM_KIND} {act.node_claim} names node {status.get('nodeName') or '(none)'} "
            f"in status.nodeName, not {act.node}"
        )
    if pool != act.pool:
        return (
            f"{NODECLAIM_KIND} {act.node_claim} is in NodePool {pool or '(none)'}, not {act.pool}"
        )
    return ""


def node_mismatch(node: dict[str, Any], act: ReplaceNode) -> str:
    """Why the Node read again is not the one to delete ("" when it is)."""
    meta = node.get("metadata") or {}
    if act.node_uid and meta.get("uid") != act.node_uid:
        return f"node {act.node} is another Node now (its UID changed)"
    if act.method == "node" and not (node.get("spec") or {}).get("unschedulable"):
        return f"node {act.node} is no longer cordoned"
    return ""


class KubeNodeReplacer:
    def __init__(self, api: ApiClient, *, timeout_s: float = 10.0) -> None:
        self._api = api
        self._timeout = timeout_s

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await request(self._api, "GET", path, timeout_s=self._timeout)
        except NotFoundError:
            return None

    async def replace(self, act: ReplaceNode) -> tuple[ReplaceOutcome, str]:
        node_path = f"/api/v1/nodes/{quote(act.node)}"
        node = await self._get(node_path)
        if node is None:
            return "not-found", f"node {act.node} does not exist"
        if why := node_mismatch(node, act):
            return "mismatch", why
        if act.method == "node":
            return await self._delete(node_path, act.node_uid, f"node {act.node}")
        claim_path = f"{NODECLAIMS}/{quote(act.node_claim)}"
        claim = await self._get(claim_path)
        if claim is None:
            return "not-found", f"{NODECLAIM_KIND} {act.node_claim} does not exist"
        if why := nodeclaim_mismatch(claim, act):
            return "mismatch", why
        return await self._delete(
            claim_path, act.node_claim_uid, f"{NODECLAIM_KIND} {act.node_claim}"
        )

    async def _delete(self, path: str, uid: str, what: str) -> tuple[ReplaceOutcome, str]:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await request(self._api, "DELETE", path, body=body, timeout_s=self._timeout)
        except NotFoundError:
            return "not-found", f"{what} does not exist"
        except KubeError as exc:
            if exc.status == 409:
                return "mismatch", f"{what} was replaced meanwhile (UID precondition): {exc}"
            raise
        return "deleted", f"{what} deleted"
