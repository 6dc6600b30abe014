"""Device IDs and DRA claims -> GPUs -> containers (pure).

The NVIDIA device plugin reports a whole GPU by its UUID (``GPU-…``) or, with
``deviceIDStrategy: index``, its index; a MIG device by its MIG UUID (``MIG-…``; the legacy
form ``MIG-GPU-<uuid>/<gi>/<ci>`` names its parent GPU) and a time-sliced replica as
``<uuid>::<n>``. DRA allocations (``dynamic_resources``) of the GPU drivers
(``dra_drivers``) map through their device name and CDI devices
(:mod:`gpuhealth.agent.podresources.devices`); their ``device_id`` is
``<driver>/<pool>/<device>`` (``::<share id>`` when the device is shared). Devices of other
resources and drivers are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.protocol import Allocation

MAX_NAME = 253
"""Longest name the wire protocol accepts (a Kubernetes object name); longer IDs are skipped."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """One ``ContainerDevices`` entry of a List response, flattened with its pod and container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One ``ClaimResource`` of a DRA allocation."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerClaim:
    """One ``DynamicResource`` of a container (a ResourceClaim's devices it uses)."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    devices: tuple[ClaimDevice, ...]


def _ok(*names: str) -> bool:
    return all(0 < len(n) <= MAX_NAME for n in names)


def allocations_from_devices(
    entries: Iterable[ContainerDevices],
    resource_prefixes: Iterable[str],
    directory: DeviceDirectory | None = None,
) -> list[Allocation]:
    """Every GPU device held by a container, sorted, without duplicates or empty names."""
    d = directory or DeviceDirectory()
    prefixes = tuple(resource_prefixes)
    out: list[Allocation] = []
    for e in entries:
        if not e.resource_name.startswith(prefixes) or not _ok(e.namespace, e.pod, e.container):
            continue
        for device_id in e.device_ids:
            if not _ok(device_id):
                continue
            gpu = d.plugin_gpu(device_id)
            out.append(Allocation(namespace=e.namespace, pod=e.pod, container=e.container,
                                  gpu_uuid=gpu, device_id=device_id))  # fmt: skip
    return _sorted(out)


def allocations_from_claims(
    claims: Iterable[ContainerClaim],
    drivers: Iterable[str],
    directory: DeviceDirectory | None = None,
) -> tuple[list[Allocation], int]:
    """Every GPU a container holds through DRA, and how many GPU-driver devices named no GPU
    the agent knows (skipped: a claim on another node's view, or a name scheme unknown)."""
    d = directory or DeviceDirectory()
    wanted = frozenset(drivers)
    out: list[Allocation] = []
    unresolved = 0
    for c in claims:
        if not _ok(c.namespace, c.pod, c.container):
            continue
        for dev in c.devices:
            if dev.driver not in wanted:
                continue
            gpu = d.dra_gpu(dev.device, dev.cdi_devices)
            device_id = f"{dev.driver}/{dev.pool}/{dev.device}"
            if dev.share_id:
                device_id += f"::{dev.share_id}"
            if gpu is None or not _ok(gpu, device_id):
                unresolved += 1
                continue
            out.append(Allocation(namespace=c.namespace, pod=c.pod, container=c.container,
                                  gpu_uuid=gpu, device_id=device_id))  # fmt: skip
    return _sorted(out), unresolved


def _sorted(allocations: Iterable[Allocation]) -> list[Allocation]:
    """Sorted by GPU, device, pod; duplicates dropped."""
    unique = {(a.namespace, a.pod, a.container, a.device_id): a for a in allocations}
    return sorted(
        unique.values(), key=lambda a: (a.gpu_uuid, a.device_id, a.namespace, a.pod, a.container)
    )
