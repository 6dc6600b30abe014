"""One GPU's multi-node NVLink fabric membership and health, read through NVML.

``nvmlDeviceGetGpuFabricInfoV`` (struct ``nvmlGpuFabricInfo_v2``: cluster UUID, clique id,
state, status, health mask) in that GPU's thread like every NVML call, never on the event
loop. Bindings without the versioned call fall back to ``nvmlDeviceGetGpuFabricInfo`` (no
health mask). A fabric state of NOT_SUPPORTED (every system that is not a multi-node NVLink
one: HGX, PCIe) is a normal answer: the sample carries no fabric (``None``), and the call,
like one answering NVML_ERROR_NOT_SUPPORTED, is not asked again for the GPU.

The decoding (:func:`decode_health_mask`, :func:`cluster_uuid`, :func:`fabric_info`) is pure.
"""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from gpuhealth.agent.observations import FabricInfo, FabricState
from gpuhealth.agent.sources.nvml.gpu import NvmlGpu

_STATES: dict[int, FabricState] = {
    0: "not-supported",
    1: "not-started",
    2: "in-progress",
    3: "completed",
}

HEALTH_FIELDS: tuple[tuple[str, int], ...] = (
    ("degraded-bandwidth", 0),
    ("route-recovery", 2),
    ("route-unhealthy", 4),
    ("access-timeout-recovery", 6),
)
"""(flag, shift) of each two-bit health-mask field whose value 1 (``..._TRUE``) is a fault
(NVML's ``NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*``; 0 = not supported, 2 = false)."""
_TRUE = 1
_WIDTH = 0x3

UNSUPPORTED_KEY = "fabric"
"""The support key (``NvmlGpu.unsupported``) of the fabric call."""


def decode_health_mask(mask: int) -> frozenset[str]:
    """The flags whose two-bit field says TRUE (a fault) in NVML's fabric health mask."""
    return frozenset(name for name, shift in HEALTH_FIELDS if (mask >> shift) & _WIDTH == _TRUE)


def cluster_uuid(raw: Iterable[int] | bytes) -> str:
    """NVML's 16 cluster-UUID bytes in GPU feature discovery's form (``8-4-4-4-12``); empty
    for all zeros (not registered) or a malformed value."""
    data = bytes(raw)
    if len(data) != 16 or not any(data):
        return ""
    return str(uuid.UUID(bytes=data))


def fabric_info(state: int, raw_uuid: Iterable[int] | bytes, clique: int, status: int,
                mask: int | None) -> FabricInfo | None:  # fmt: skip
    """One NVML answer as a :class:`FabricInfo`; None for state NOT_SUPPORTED (no fabric)."""
    name = _STATES.get(int(state))
    if name is None or name == "not-supported":
        return None
    return FabricInfo(
        state=name,
        cluster_uuid=cluster_uuid(raw_uuid),
        clique_id=int(clique),
        status=int(status),
        health=frozenset() if mask is None else decode_health_mask(int(mask)),
    )


class FabricReader:
    """Reads one GPU's fabric info (in that GPU's thread) through the NVML source's ``opt``
    (NOT_SUPPORTED remembered, GPU_IS_LOST raised, other errors counted)."""

    def __init__(self, nvml: Any, opt: Callable[..., Any]) -> None:
        self._nvml = nvml
        self._opt = opt

    def read(self, g: NvmlGpu) -> FabricInfo | None:
        if UNSUPPORTED_KEY in g.unsupported:
            return None
        n = self._nvml
        versioned = getattr(n, "nvmlDeviceGetGpuFabricInfoV", None)
        struct_v = getattr(n, "c_nvmlGpuFabricInfoV_t", None)
        if versioned is not None and struct_v is not None:
            info = struct_v()
            fn, mask_field = versioned, True
        else:
            legacy = getattr(n, "nvmlDeviceGetGpuFabricInfo", None)
            struct = getattr(n, "c_nvmlGpuFabricInfo_t", None)
            if legacy is None or struct is None:
                g.unsupported.add(UNSUPPORTED_KEY)
                return None
            info = struct()
            fn, mask_field = legacy, False
        if self._opt(g, UNSUPPORTED_KEY, fn, g.handle, ctypes.byref(info)) is None:
            return None  # an error (pynvml answers NVML_SUCCESS, 0, when it filled the struct)
        result = fabric_info(
            info.state,
            info.clusterUuid,
            info.cliqueId,
            info.status,
            info.healthMask if mask_field else None,
        )
        if result is None:
            g.unsupported.add(UNSUPPORTED_KEY)  # a system without a fabric: not asked again
        return result
