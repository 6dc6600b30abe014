"""Objects tests and the demo need: fake GPU nodes, namespaces, bound pods, bound tokens.

Bodies are plain dicts (the wire format, as ``kubectl`` would send them); the async
helpers take a ``kubernetes_asyncio`` ApiClient.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubernetes_asyncio import client

from localkube.process import LocalKubeError

T = TypeVar("T")

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok manages nodes annotated ``kwok.x-k8s.io/node: fake`` (see kwok.py)."""
GPU_RESOURCE = "nvidia.com/gpu"
MIN_TOKEN_SECONDS = 600
"""The apiserver rejects bound tokens that expire sooner than this."""


def gpu_node_body(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    kwok: bool = True,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node with ``nvidia.com/gpu`` in status capacity and allocatable.

    Status is accepted on create (nodes register themselves with it) and kwok's
    node-initialize stage keeps the capacity it finds, so the GPUs stay schedulable.
    With ``kwok=True`` the annotation and ``type: kwok`` label hand the node to kwok.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": pods, GPU_RESOURCE: str(gpus)}
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.present": "true",
        **({"type": "kwok"} if kwok else {}),
        **(labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {KWOK_ANNOTATION: "fake"} if kwok else {},
        },
        "spec": {"taints": list(taints or [])},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def pod_body(
    name: str,
    *,
    node_name: str | None = None,
    service_account: str | None = None,
    gpus: int = 0,
    node_selector: dict[str, str] | None = None,
    scheduler_name: str | None = None,
    image: str = "registry.k8s.io/pause:3.10",
) -> dict[str, Any]:
    """A one-container pod; ``node_name`` binds it directly, bypassing the scheduler."""
    container: dict[str, Any] = {"name": "main", "image": image}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    if service_account:
        spec["serviceAccountName"] = service_account
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def create_namespace(api: client.ApiClient, name: str) -> Any:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    return await client.CoreV1Api(api).create_namespace(body)


async def create_service_account(api: client.ApiClient, namespace: str, name: str) -> Any:
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    return await client.CoreV1Api(api).create_namespaced_service_account(namespace, body)


async def create_gpu_node(api: client.ApiClient, name: str, **kwargs: Any) -> Any:
    """Create the node of :func:`gpu_node_body` (same keyword arguments)."""
    return await client.CoreV1Api(api).create_node(gpu_node_body(name, **kwargs))


async def create_pod(api: client.ApiClient, namespace: str, name: str, **kwargs: Any) -> Any:
    """Create the pod of :func:`pod_body` (same keyword arguments)."""
    return await client.CoreV1Api(api).create_namespaced_pod(namespace, pod_body(name, **kwargs))


async def request_bound_token(
    api: client.ApiClient,
    namespace: str,
    service_account: str,
    pod: Any,
    audience: str,
    *,
    expiration_seconds: int = MIN_TOKEN_SECONDS,
) -> str:
    """A TokenRequest bound to ``pod`` (a V1Pod); the node name is embedded when bound."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": max(expiration_seconds, MIN_TOKEN_SECONDS),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }
    resp = await client.CoreV1Api(api).create_namespaced_service_account_token(
        service_account, namespace, body
    )
    token: str = resp.status.token
    return token


async def wait_for(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
) -> T:
    """Poll ``check`` until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise LocalKubeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)
