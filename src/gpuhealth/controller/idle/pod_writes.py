"""Pod writes for idle allocations: an Event ``GPUIdle`` on the Pod, an optional annotation.

Nothing here evicts or changes a pod's spec; the annotation is a merge patch of one key.
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

from gpuhealth.controller.kube.events import post_event
from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, NotFoundError, request
from gpuhealth.controller.names import CONTROLLER


class PodApi:
    def __init__(
        self,
        api: ApiClient,
        *,
        component: str = CONTROLLER,
        request_timeout_s: float = 10.0,
    ) -> None:
        self._api = api
        self._component = component
        self._timeout = request_timeout_s

    def _path(self, namespace: str, pod: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}"

    async def create_event(
        self, namespace: str, pod: str, reason: str, message: str, now: datetime
    ) -> bool:
        """A core/v1 Event about the Pod (with its UID, so ``kubectl describe pod`` lists it).

        Returns False when the pod no longer exists.
        """
        try:
            obj = await request(
                self._api, "GET", self._path(namespace, pod), timeout_s=self._timeout
            )
        except NotFoundError:
            return False
        meta = obj.get("metadata") or {}
        await post_event(
            self._api,
            namespace=namespace,
            involved={
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": pod,
                "uid": meta.get("uid", ""),
            },
            reason=reason,
            message=message,
            event_type="Normal",
            component=self._component,
            now=now,
            timeout_s=self._timeout,
        )
        return True

    async def set_annotation(self, namespace: str, pod: str, key: str, value: str | None) -> bool:
        """Set (or with ``None`` remove) one annotation; False when the pod is gone."""
        body = {"metadata": {"annotations": {key: value}}}
        try:
            await request(
                self._api,
                "PATCH",
                self._path(namespace, pod),
                body=body,
                content_type=MERGE_PATCH,
                timeout_s=self._timeout,
            )
        except NotFoundError:
            return False
        return True
