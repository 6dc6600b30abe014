"""Device IDs -> GPUs -> containers (pure).

The NVIDIA device plugin reports a whole GPU by its UUID (``GPU-…``), a MIG device by its
MIG UUID (``MIG-…``; the legacy form ``MIG-GPU-<uuid>/<gi>/<ci>`` names its parent GPU) and a
time-sliced replica as ``<uuid>::<n>``. Devices of other resources are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveSeconds, Settings
from gpuhealth.protocol import Allocation

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_NAME = 253
"""Longest name the wire protocol accepts (a Kubernetes object name); longer IDs are skipped."""


class PodResourcesSettings(Settings, frozen=True, kw_only=True):
    """How the agent asks the kubelet which container holds which GPU."""

    enabled: bool = True
    """Attribute GPUs to pods (off: per-GPU series never carry pod labels)."""
    socket: str = DEFAULT_SOCKET
    """The kubelet PodResources unix socket; the agent only reads it."""
    refresh_interval_s: PositiveSeconds = 10.0
    """Seconds between List calls. Allocations change only when pods start or stop; the
    kubelet rate-limits this API, and scrapes never call it (they read the cache)."""
    call_timeout_s: PositiveSeconds = 5.0
    """Deadline of one List / GetAllocatableResources call."""
    resource_prefixes: tuple[str, ...] = ("nvidia.com/",)
    """Extended-resource names whose devices are GPUs (``nvidia.com/gpu``, ``nvidia.com/mig-…``)."""
    max_message_bytes: Annotated[int, Meta(ge=4096, le=1 << 30)] = 16 * 1024 * 1024
    """Largest List response accepted (the kubelet's own default limit)."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """One ``ContainerDevices`` entry of a List response, flattened with its pod and container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


def gpu_uuid_for_device(device_id: str, mig_parents: Mapping[str, str] | None = None) -> str:
    """The GPU UUID a device ID belongs to; the ID itself when it cannot be resolved.

    ``mig_parents`` maps MIG UUIDs to their parent GPU (from NVML, when known).
    """
    base = device_id.split("::", 1)[0]
    if base.startswith("MIG-GPU-"):
        return base[len("MIG-") :].split("/", 1)[0]
    if base.startswith("MIG-") and mig_parents is not None:
        return mig_parents.get(base, base)
    return base


def allocations_from_devices(
    entries: Iterable[ContainerDevices],
    resource_prefixes: Iterable[str],
    mig_parents: Mapping[str, str] | None = None,
) -> list[Allocation]:
    """Every GPU device held by a container, sorted, without duplicates or empty names."""
    prefixes = tuple(resource_prefixes)
    seen: set[tuple[str, str, str, str]] = set()
    out: list[Allocation] = []
    for e in entries:
        if not e.resource_name.startswith(prefixes):
            continue
        if not all(0 < len(n) <= MAX_NAME for n in (e.namespace, e.pod, e.container)):
            continue
        for device_id in e.device_ids:
            if not 0 < len(device_id) <= MAX_NAME:
                continue
            key = (e.namespace, e.pod, e.container, device_id)
            if key in seen:
                continue
            seen.add(key)
            out.append(
                Allocation(
                    namespace=e.namespace,
                    pod=e.pod,
                    container=e.container,
                    gpu_uuid=gpu_uuid_for_device(device_id, mig_parents),
                    device_id=device_id,
                )
            )
    out.sort(key=lambda a: (a.gpu_uuid, a.device_id, a.namespace, a.pod, a.container))
    return out
