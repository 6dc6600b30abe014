"""The kubelet's PodResources API for the demo's kwok nodes (kwok runs no kubelet).

One grpc.aio server per node on a unix socket, speaking the real v1 proto the agent's client
uses; it reports the GPUs the demo's running pods hold (``set_allocations``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio

from demo.plan import DEVICE_ANNOTATION
from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class PodAllocation:
    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]


class _Lister(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.pods: list[Any] = []
        self.allocatable: list[str] = []

    async def List(self, request: Any, context: Any) -> Any:
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name=GPU_RESOURCE, device_ids=[d])
                for d in self.allocatable
            ]
        )


class DemoKubelets:
    """A PodResources socket per node under ``directory``."""

    def __init__(self, directory: Path, nodes: Sequence[str]) -> None:
        self.directory = directory
        self.nodes = tuple(nodes)
        self._listers = {n: _Lister() for n in self.nodes}
        self._servers: list[grpc.aio.Server] = []

    def socket(self, node: str) -> Path:
        return self.directory / f"{node}.sock"

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for node, lister in self._listers.items():
            server = grpc.aio.server()
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
            server.add_insecure_port(f"unix://{self.socket(node)}")
            await server.start()
            self._servers.append(server)

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(grace=0.5)
        self._servers.clear()

    def set_allocatable(self, node: str, uuids: Sequence[str]) -> None:
        self._listers[node].allocatable = list(uuids)

    def set_allocations(self, by_node: Mapping[str, Sequence[PodAllocation]]) -> None:
        """Replace every node's pod list (nodes not named get none)."""
        for node, lister in self._listers.items():
            lister.pods = [
                api_pb2.PodResources(
                    namespace=a.namespace,
                    name=a.pod,
                    containers=[
                        api_pb2.ContainerResources(
                            name=a.container,
                            devices=[
                                api_pb2.ContainerDevices(
                                    resource_name=GPU_RESOURCE, device_ids=list(a.device_ids)
                                )
                            ],
                        )
                    ],
                )
                for a in by_node.get(node, ())
            ]


def allocations_for(
    pods: list[Any], uuids: dict[str, dict[int, str]]
) -> dict[str, list[PodAllocation]]:
    """What a kubelet would report: running pods bound to a node, with the GPUs they hold."""
    out: dict[str, list[PodAllocation]] = {}
    for p in pods:
        node = p.spec.node_name
        if not node or (p.status.phase or "") != "Running" or node not in uuids:
            continue
        wanted = (p.metadata.annotations or {}).get(DEVICE_ANNOTATION, "")
        ids = tuple(uuids[node][int(i)] for i in wanted.split(",") if i.strip().isdigit())
        if ids:
            container = p.spec.containers[0].name
            out.setdefault(node, []).append(
                PodAllocation(p.metadata.namespace, p.metadata.name, container, ids)
            )
    return out
