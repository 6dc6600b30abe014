"""Node reads and writes: taints/labels/annotations in one guarded merge patch, the
GPUHealthy condition through nodes/status, Events about Nodes.

``spec.taints`` is an atomic list: the patch always carries the node's complete taint list
(foreign taints verbatim) together with ``metadata.resourceVersion``, so a concurrent writer
makes it fail with 409 instead of being overwritten; the caller re-reads and retries. Every
write names the controller as its field manager (``gpuhealth-controller``): the node's
managedFields then tell its writes, from any replica, from a person's (a taint removed by
hand, ``gpuhealth.controller.taints.plan.hand_removed``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from gpuhealth.controller.kube.events import KubeEvent, post_event
from gpuhealth.controller.kube.node_view import NodeView, node_view
from gpuhealth.controller.kube.rest import MERGE_PATCH, STRATEGIC_PATCH, ApiClient, request
from gpuhealth.controller.names import CONTROLLER


class NodeApi:
    def __init__(
        self,
        api: ApiClient,
        *,
        gpu_resource: str = "nvidia.com/gpu",
        timeout_s: float = 10.0,
        events_namespace: str = "default",
        component: str = CONTROLLER,
    ) -> None:
        self._api = api
        self._gpu_resource = gpu_resource
        self._timeout = timeout_s
        self._events_ns = events_namespace
        self._component = component

    async def get(self, name: str) -> NodeView:
        obj = await request(
            self._api, "GET", f"/api/v1/nodes/{quote(name)}", timeout_s=self._timeout
        )
        return node_view(obj, self._gpu_resource)

    async def patch(self, name: str, body: dict[str, Any]) -> NodeView:
        """Merge-patch the Node; raises ConflictError when its resourceVersion moved."""
        obj = await request(
            self._api,
            "PATCH",
            f"/api/v1/nodes/{quote(name)}",
            query=[("fieldManager", CONTROLLER)],
            body=body,
            content_type=MERGE_PATCH,
            timeout_s=self._timeout,
        )
        return node_view(obj, self._gpu_resource)

    async def patch_status(self, name: str, body: dict[str, Any]) -> NodeView:
        obj = await request(
            self._api,
            "PATCH",
            f"/api/v1/nodes/{quote(name)}/status",
            query=[("fieldManager", CONTROLLER)],
            body=body,
            content_type=STRATEGIC_PATCH,
            timeout_s=self._timeout,
        )
        return node_view(obj, self._gpu_resource)

    async def create_event(self, node: str, event: KubeEvent, now: datetime) -> None:
        """A core/v1 Event whose involvedObject is the Node (``kubectl describe node`` shows it)."""
        await post_event(
            self._api,
            namespace=self._events_ns,
            involved={"apiVersion": "v1", "kind": "Node", "name": node},
            reason=event.reason,
            message=event.message,
            event_type=event.type,
            component=self._component,
            now=now,
            timeout_s=self._timeout,
        )
