"""The leader-election Lease (``coordination.k8s.io/v1``): read, create, guarded update.

Updates carry the resourceVersion that was read, so two replicas racing for an expired Lease
cannot both win: the loser gets 409 (:class:`~gpuhealth.controller.kube.rest.ConflictError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio import client

from gpuhealth.controller.kube.rest import NotFoundError, request

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
"""The Lease's ``acquireTime`` / ``renewTime`` format (Kubernetes MicroTime)."""


def micro_time(t: datetime) -> str:
    return t.strftime(MICRO_TIME)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    """``spec.holderIdentity``; empty when nobody holds it (released)."""
    duration_s: int
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


def lease_record(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=str(spec.get("acquireTime") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


class LeaseClient:
    """One Lease, by namespace and name (RBAC: ``create`` leases; ``get``, ``update`` on it)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        self._path = f"{self._collection}/{quote(name)}"

    async def get(self, *, timeout_s: float) -> LeaseRecord | None:
        """The Lease, or None when it does not exist."""
        try:
            return lease_record(await request(self._api, "GET", self._path, timeout_s=timeout_s))
        except NotFoundError:
            return None

    async def create(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.spec(),
        }
        return lease_record(
            await request(self._api, "POST", self._collection, body=body, timeout_s=timeout_s)
        )

    async def update(self, record: LeaseRecord, *, timeout_s: float) -> LeaseRecord:
        """PUT guarded by ``record.resource_version`` (409 when the Lease moved on)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": record.resource_version,
            },
            "spec": record.spec(),
        }
        return lease_record(
            await request(self._api, "PUT", self._path, body=body, timeout_s=timeout_s)
        )
