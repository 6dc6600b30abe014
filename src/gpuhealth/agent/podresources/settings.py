"""The settings of the kubelet PodResources client: the ``podresources:`` section."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveSeconds, Settings

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


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
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    """DRA drivers whose claimed devices are GPUs (NVIDIA's DRA driver: ``gpu.nvidia.com``)."""
