"""The leader publishes itself as the endpoint of the controller's Service.

Agents' streams and kube-scheduler's extender calls must reach the leader: only it holds the
whole fleet and acts. The chart's Service has no selector; while this replica leads it keeps
one EndpointSlice of that Service pointing at its own pod IP (the way kube-apiserver keeps the
``kubernetes`` Service's endpoint). Readiness then need not mean leadership, so both replicas
are Ready, rolling updates complete and a standby takes over as soon as the Lease moves.

The slice is owned by the Service (ownerReference), so deleting the Service (``helm
uninstall``) deletes it too. It is written with a merge patch, created when missing, and
re-asserted every ``interval_s`` (repairing an edit or a lost write). When the leader work
ends (lead lost, shutdown) the slice is emptied if it still names this pod: clients are then
refused at once and retry, where a dead address would hold each connection attempt until its
timeout; the next leader publishes itself.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.names import ENDPOINT_SLICE_MANAGER

log = get_logger("kube.leader_endpoint")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def slice_name(service: str) -> str:
    return f"{service}-leader"


def endpoint_slice(
    *,
    namespace: str,
    service: str,
    service_uid: str,
    pod_name: str,
    pod_ip: str,
    port: int,
    port_name: str,
) -> dict[str, Any]:
    """The EndpointSlice that sends ``service``'s traffic to this pod (pure)."""
    family = "IPv6" if ipaddress.ip_address(pod_ip).version == 6 else "IPv4"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(service),
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: service,
                "endpointslice.kubernetes.io/managed-by": ENDPOINT_SLICE_MANAGER,
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": service, "uid": service_uid}
            ],
        },
        "addressType": family,
        "endpoints": [
            {
                "addresses": [pod_ip],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod_name, "namespace": namespace},
            }
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


class LeaderEndpoint:
    """``run()`` as leader work: publish, then re-assert every ``interval_s``."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        service: str,
        pod_name: str,
        pod_ip: str,
        port: int,
        port_name: str = "http",
        interval_s: float = 10.0,
        timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        ipaddress.ip_address(pod_ip)  # ValueError now rather than a bad slice later
        self._api = api
        self.namespace = namespace
        self.service = service
        self.pod_name = pod_name
        self.pod_ip = pod_ip
        self.port = port
        self.port_name = port_name
        self.interval_s = interval_s
        self._timeout = timeout_s
        self._clock = clock or SystemClock()
        self._base = f"/apis/discovery.k8s.io/v1/namespaces/{quote(namespace)}/endpointslices"

    async def _service_uid(self) -> str:
        svc = await request(
            self._api,
            "GET",
            f"/api/v1/namespaces/{quote(self.namespace)}/services/{quote(self.service)}",
            timeout_s=self._timeout,
        )
        uid: str = svc["metadata"]["uid"]
        return uid

    async def publish(self) -> None:
        """Point the Service at this pod (create the slice if it is missing)."""
        body = endpoint_slice(
            namespace=self.namespace,
            service=self.service,
            service_uid=await self._service_uid(),
            pod_name=self.pod_name,
            pod_ip=self.pod_ip,
            port=self.port,
            port_name=self.port_name,
        )
        path = f"{self._base}/{quote(slice_name(self.service))}"
        try:
            await request(
                self._api,
                "PATCH",
                path,
                body=body,
                content_type=MERGE_PATCH,
                timeout_s=self._timeout,
            )
        except NotFoundError:
            # A 409 here (created in between) is transient: the next round patches it.
            await request(self._api, "POST", self._base, body=body, timeout_s=self._timeout)

    async def withdraw(self) -> None:
        """Empty the slice if it still names this pod, so that clients are refused at once
        (and retry) instead of waiting on a dead address; never touches a newer leader's."""
        path = f"{self._base}/{quote(slice_name(self.service))}"
        try:
            current = await request(self._api, "GET", path, timeout_s=self._timeout)
        except NotFoundError:
            return
        addresses = [a for e in current.get("endpoints") or [] for a in e.get("addresses", [])]
        if addresses != [self.pod_ip]:
            return
        # The resourceVersion makes the patch conditional: a 409 means someone wrote since.
        body = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "endpoints": [],
        }
        await request(
            self._api, "PATCH", path, body=body, content_type=MERGE_PATCH, timeout_s=self._timeout
        )
        log.info("leader_endpoint_withdrawn", service=self.service, address=self.pod_ip)

    async def run(self) -> None:
        """Publish, re-assert every ``interval_s``; withdraw when the leader work ends."""
        try:
            await self._keep_published()
        finally:
            try:
                await self._clock.wait_for(self.withdraw(), self._timeout)
            except (KubeError, TimeoutError) as exc:
                log.warning("leader_endpoint_withdraw_failed", service=self.service, error=str(exc))

    async def _keep_published(self) -> None:
        published = False
        while True:
            try:
                await self.publish()
                if not published:
                    log.info("leader_endpoint_published", service=self.service, address=self.pod_ip)
                    published = True
            except KubeError as exc:
                # Never crash the leader work (the reconciler runs beside this): a missing
                # Service or missing RBAC is logged and retried.
                published = False
                log.error("leader_endpoint_failed", service=self.service, error=str(exc))
            await self._clock.sleep(self.interval_s)
