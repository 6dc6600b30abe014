"""A ConfigMap of the controller's own (the breaker's state, the shards' sizes): its ``data``
read, and written whole or in part, created when missing.

A write is a JSON merge patch of ``data`` (the keys given replace theirs, the others stay); a
ConfigMap that does not exist yet is created with the data and the label
``app.kubernetes.io/managed-by: gpuhealth-controller``. A read that fails raises our
:class:`~gpuhealth.controller.kube.rest.KubeError`; 404 is the answer "none" (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, NotFoundError, request
from gpuhealth.controller.names import CONTROLLER, MANAGED_BY_LABEL


def configmaps_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/configmaps"


async def read_data(
    api: ApiClient, namespace: str, name: str, *, timeout_s: float
) -> dict[str, Any] | None:
    """The ConfigMap's ``data`` (empty when it has none); None when there is no such
    ConfigMap."""
    try:
        cm = await request(
            api, "GET", f"{configmaps_path(namespace)}/{quote(name)}", timeout_s=timeout_s
        )
    except NotFoundError:
        return None
    data = cm.get("data")
    return dict(data) if isinstance(data, dict) else {}


async def write_data(
    api: ApiClient, namespace: str, name: str, data: Mapping[str, str], *, timeout_s: float
) -> None:
    """Merge ``data`` into the ConfigMap's, or create it with ``data``."""
    path = configmaps_path(namespace)
    try:
        await request(
            api,
            "PATCH",
            f"{path}/{quote(name)}",
            body={"data": dict(data)},
            content_type=MERGE_PATCH,
            timeout_s=timeout_s,
        )
    except NotFoundError:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: CONTROLLER},
            },
            "data": dict(data),
        }
        await request(api, "POST", path, body=body, timeout_s=timeout_s)
