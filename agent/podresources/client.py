"""A grpc.aio client for the kubelet PodResources v1 API on its unix socket."""

from __future__ import annotations

import grpc
import grpc.aio

from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc
from gpuhealth.agent.podresources.mapping import ContainerDevices, PodResourcesSettings
from gpuhealth.common.errors import TransientError


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

    async def list(self) -> list[ContainerDevices]:
        """Every (pod, container, resource) with devices, as the kubelet reports it now."""
        try:
            resp = await self._get_stub().List(
                api_pb2.ListPodResourcesRequest(), timeout=self._settings.call_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"PodResources List on {self._settings.socket}: {exc.code().name}: {exc.details()}"
            ) from exc
        return [
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
