"""The remediation loop's pod I/O: what runs on a node and in a gang, PodDisruptionBudgets,
evictions through the Eviction API, validation pods, and the RMA label on the Node.

Evictions are the ``policy/v1`` Eviction subresource only, with the pod's UID as a
precondition (a StatefulSet's replacement of the same name is never evicted by mistake).
The API answers 201 (evicting), 429 (a PodDisruptionBudget refuses it now: wait and try
again), 404 (already gone) or 409 (the UID changed: the pod we meant is gone). A pod is
deleted directly only by :meth:`force_delete`, for pods already evicted and stuck
terminating, where a namespace rule allows it.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import quote

import msgspec

from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ApiClient,
    KubeError,
    NotFoundError,
    error_for,
    open_request,
    request,
)
from gpuhealth.controller.names import CONTROLLER, MANAGED_BY_LABEL, Keys
from gpuhealth.controller.remediation.facts import PdbFacts, PodFacts, ValidationPodFacts
from gpuhealth.controller.remediation.gang import Gang
from gpuhealth.controller.remediation.model import API_VERSION, KIND, Episode
from gpuhealth.controller.remediation.outcomes import EvictionOutcome
from gpuhealth.controller.remediation.pod_facts import pdb_facts, pod_facts, validation_pod_facts
from gpuhealth.controller.remediation.settings import ValidationPodSettings

_decoder = msgspec.json.Decoder()
PAGE = 500
"""Items per LIST page (``limit``/``continue``)."""


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"


class RemediationPods:
    """Implements the runner's ``PodReader`` and ``Disruptor`` ports."""

    def __init__(
        self,
        api: ApiClient,
        keys: Keys,
        *,
        gpu_resource: str = "nvidia.com/gpu",
        validation: ValidationPodSettings | None = None,
        timeout_s: float = 10.0,
        own_namespace: str = "",
    ) -> None:
        """``own_namespace``: gpuhealth's namespace, where its own pods are recognised by
        their owner (``PodFacts.release_owned``)."""
        self._own = own_namespace
        self._api = api
        self._keys = keys
        self._gpu = gpu_resource
        self._validation = validation
        self._timeout = timeout_s

    async def _list(self, path: str, query: list[tuple[str, str]]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            q = [*query, ("limit", str(PAGE))] + ([("continue", cont)] if cont else [])
            data = await request(self._api, "GET", path, query=q, timeout_s=self._timeout)
            items += data.get("items") or []
            cont = str((data.get("metadata") or {}).get("continue") or "")
            if not cont:
                return items

    # -- PodReader ------------------------------------------------------------------------------

    async def pods_on_node(self, node: str) -> list[PodFacts]:
        query = [("fieldSelector", f"spec.nodeName={node}")]
        return [pod_facts(o, self._gpu, self._own) for o in await self._list("/api/v1/pods", query)]

    async def gang_members(self, gang: Gang) -> list[PodFacts]:
        path = f"/api/v1/namespaces/{quote(gang.namespace)}/pods"
        selector = gang.label_selector()
        query = [("labelSelector", selector)] if selector else []
        pods = [pod_facts(o, self._gpu, self._own) for o in await self._list(path, query)]
        return [p for p in pods if gang.has(p)]

    async def pod(self, namespace: str, name: str) -> PodFacts | None:
        try:
            obj = await request(
                self._api, "GET", _pod_path(namespace, name), timeout_s=self._timeout
            )
        except NotFoundError:
            return None
        return pod_facts(obj, self._gpu, self._own)

    async def pdbs(self, namespace: str) -> list[PdbFacts]:
        path = f"/apis/policy/v1/namespaces/{quote(namespace)}/poddisruptionbudgets"
        return [pdb_facts(o) for o in await self._list(path, [])]

    async def validation_pod(self, namespace: str, name: str) -> ValidationPodFacts | None:
        try:
            obj = await request(
                self._api, "GET", _pod_path(namespace, name), timeout_s=self._timeout
            )
        except NotFoundError:
            return None
        return validation_pod_facts(obj)

    # -- Disruptor ----------------------------------------------------------------------------

    async def evict(self, pod: PodFacts, grace_period_s: int | None) -> tuple[EvictionOutcome, str]:
        options: dict[str, Any] = {"preconditions": {"uid": pod.uid}} if pod.uid else {}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": options,
        }
        path = _pod_path(pod.namespace, pod.name) + "/eviction"
        resp = await open_request(self._api, "POST", path, body=body, timeout_s=self._timeout)
        try:
            data = await resp.read()
        except Exception as exc:
            raise error_for(0, f"evict {pod.namespace}/{pod.name}: {exc}") from exc
        finally:
            resp.release()
        if 200 <= resp.status < 300:
            return "evicted", ""
        message = _status_message(data)
        if resp.status == 429:
            return "blocked", message
        if resp.status in (404, 409):
            return "gone", message
        return "error", f"HTTP {resp.status}: {message}"

    async def force_delete(self, pod: PodFacts) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}}
        try:
            await request(
                self._api,
                "DELETE",
                _pod_path(pod.namespace, pod.name),
                body=body,
                timeout_s=self._timeout,
            )
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise

    def validation_pod_body(self, name: str, node: str, ep: Episode) -> dict[str, Any]:
        """The user's PodSpec, bound to the node, tolerating the quarantine (and every
        gpuhealth taint), owned by the episode (deleted with it)."""
        cfg = self._validation
        if cfg is None:
            raise ValueError("no validation pod is configured")
        spec: dict[str, Any] = copy.deepcopy(dict(cfg.spec))
        spec["nodeName"] = node
        spec.setdefault("restartPolicy", "Never")
        spec.setdefault("activeDeadlineSeconds", max(1, int(cfg.timeout_s)))
        keys = self._keys
        tolerations = list(spec.get("tolerations") or [])
        for key in (keys.quarantine_taint, keys.unhealthy_taint, keys.degraded_taint):
            tolerations.append({"key": key, "operator": "Exists"})
        spec["tolerations"] = tolerations
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": cfg.namespace,
                "labels": {
                    MANAGED_BY_LABEL: CONTROLLER,
                    self._keys.episode_label: ep.spec.fault.fingerprint,
                },
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": KIND, "name": ep.name, "uid": ep.uid}
                ],
            },
            "spec": spec,
        }

    async def create_validation_pod(self, name: str, node: str, ep: Episode) -> str | None:
        """The created pod's UID; None when a pod of that name exists already (whoever made
        it: it is never taken for the one created)."""
        body = self.validation_pod_body(name, node, ep)
        path = f"/api/v1/namespaces/{quote(body['metadata']['namespace'])}/pods"
        try:
            created = await request(self._api, "POST", path, body=body, timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status != 409:
                raise
            return None
        uid = (created.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    async def set_node_label(self, node: str, key: str, value: str | None) -> None:
        body = {"metadata": {"labels": {key: value}}}
        await request(
            self._api,
            "PATCH",
            f"/api/v1/nodes/{quote(node)}",
            body=body,
            content_type=MERGE_PATCH,
            timeout_s=self._timeout,
        )


def _status_message(data: bytes) -> str:
    """The message of a metav1.Status answer (with its causes), or the raw text."""
    try:
        status = _decoder.decode(data)
    except msgspec.DecodeError:
        return data[:300].decode("utf-8", "replace")
    if not isinstance(status, dict):
        return ""
    causes = [
        str(c.get("message", ""))
        for c in (status.get("details") or {}).get("causes") or ()
        if isinstance(c, dict) and c.get("message")
    ]
    return "; ".join([str(status.get("message", "")), *causes]).strip("; ")[:500]
