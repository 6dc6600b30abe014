"""core/v1 Events about Nodes and Pods (what ``kubectl describe`` lists)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio import client

from gpuhealth.controller.kube.rest import request


@dataclass(frozen=True, slots=True)
class KubeEvent:
    """A core/v1 Event to write about an object (``kubectl describe`` lists them)."""

    type: str
    """Normal or Warning."""
    reason: str
    message: str


MAX_MESSAGE = 1024
"""Longer messages are cut: the API server caps Event messages and long ones help nobody."""


async def post_event(
    api: client.ApiClient,
    *,
    namespace: str,
    involved: dict[str, Any],
    reason: str,
    message: str,
    event_type: str,
    component: str,
    now: datetime,
    timeout_s: float,
) -> None:
    """Create one Event in ``namespace`` about ``involved`` (an ObjectReference)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{str(involved['name'])[:200]}.{uuid.uuid4().hex[:16]}",
            "namespace": namespace,
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    await request(
        api,
        "POST",
        f"/api/v1/namespaces/{quote(namespace)}/events",
        body=body,
        timeout_s=timeout_s,
    )
