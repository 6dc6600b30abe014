"""Pod attribution: which container holds which GPU, from the kubelet PodResources v1 API.

The gRPC client (:mod:`.client`) imports grpc; import it lazily so that an agent without a
kubelet socket (simulator, benchmarks) does not pay for grpc in memory.
"""

from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.agent.podresources.mapping import (
    ClaimDevice,
    ContainerClaim,
    ContainerDevices,
    allocations_from_claims,
    allocations_from_devices,
)
from gpuhealth.agent.podresources.settings import PodResourcesSettings

__all__ = [
    "ClaimDevice",
    "ContainerClaim",
    "ContainerDevices",
    "DeviceDirectory",
    "PodResourcesSettings",
    "allocations_from_claims",
    "allocations_from_devices",
]
