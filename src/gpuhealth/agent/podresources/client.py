"""A grpc.aio client for the kubelet PodResources v1 API on its unix socket."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio

from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc
from gpuhealth.agent.podresources.mapping import ClaimDevice, ContainerClaim, ContainerDevices
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from gpuhealth.common.errors import TransientError


@dataclass(frozen=True, slots=True)
class PodResourcesList:
    """A List response, flattened: device-plugin devices and DRA claims per container."""

    devices: list[ContainerDevices]
    claims: list[ContainerClaim]


class PodResourcesError(TransientError):
    """The kubelet did not answer (socket missing, refused, deadline, RPC error)."""


class PodResourcesClient:
    """``List`` and ``GetAllocatableResources``; the channel reconnects by itself."""

    def __init__(self, settings: PodResourcesSettings) -> None:
        self._settings = settings
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _get_stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            limit = self._settings.max_message_bytes
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self._settings.socket}",
                options=[("grpc.max_receive_message_length", limit)],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def list(self) -> PodResourcesList:
        """Every (pod, container, resource) with devices and every (pod, container, claim)
        with DRA devices, as the kubelet reports them now."""
        try:
            resp = await self._get_stub().List(
                api_pb2.ListPodResourcesRequest(), timeout=self._settings.call_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"PodResources List on {self._settings.socket}: {exc.code().name}: {exc.details()}"
            ) from exc
        devices = [
            ContainerDevices(
                namespace=pod.namespace,
                pod=pod.name,
                container=ctr.name,
                resource_name=dev.resource_name,
                device_ids=tuple(dev.device_ids),
            )
            for pod in resp.pod_resources
            for ctr in pod.containers
            for dev in ctr.devices
        ]
        claims = [
            ContainerClaim(
                namespace=pod.namespace,
                pod=pod.name,
                container=ctr.name,
                claim_namespace=dr.claim_namespace,
                claim_name=dr.claim_name,
                devices=tuple(
                    ClaimDevice(
                        driver=cr.driver_name,
                        pool=cr.pool_name,
                        device=cr.device_name,
                        cdi_devices=tuple(c.name for c in cr.cdi_devices),
                        share_id=cr.share_id if cr.HasField("share_id") else None,
                    )
                    for cr in dr.claim_resources
                ),
            )
            for pod in resp.pod_resources
            for ctr in pod.containers
            for dr in ctr.dynamic_resources
        ]
        return PodResourcesList(devices=devices, claims=claims)

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """Resource name -> device IDs the kubelet can hand out."""
        try:
            resp = await self._get_stub().GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._settings.call_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"PodResources GetAllocatableResources on {self._settings.socket}: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
        out: dict[str, tuple[str, ...]] = {}
        for dev in resp.devices:
            out[dev.resource_name] = out.get(dev.resource_name, ()) + tuple(dev.device_ids)
        return out

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
