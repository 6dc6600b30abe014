"""Pod attribution: which container holds which GPU, from the kubelet PodResources v1 API.

The gRPC client (:mod:`.client`) imports grpc; import it lazily so that an agent without a
kubelet socket (simulator, benchmarks) does not pay for grpc in memory.
"""

from gpuhealth.agent.podresources.mapping import (
    ContainerDevices,
    PodResourcesSettings,
    allocations_from_devices,
    gpu_uuid_for_device,
)

__all__ = [
    "ContainerDevices",
    "PodResourcesSettings",
    "allocations_from_devices",
    "gpu_uuid_for_device",
]
