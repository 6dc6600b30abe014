"""One dcgm-exporter scrape -> one deduplicated set of values per GPU (pure, no I/O).

dcgm-exporter writes each field once per entity it watches, and copies series on top:

- a GPU shared by several pods (time-slicing, MPS, DRA) gets one copy of every series per
  pod (labels ``pod``/``namespace``/``container``, or ``pod_name``/``pod_namespace``/
  ``container_name`` with ``--use-old-namespace``), all with the GPU's value; with
  per-process attribution on, ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` get the
  GPU's own (pod-less) series plus one per pod holding that pod's share;
- a GPU in MIG mode is watched as the GPU and as each GPU instance (labels ``GPU_I_ID``,
  ``GPU_I_PROFILE``): device-wide fields come once per entity, framebuffer and profiling
  fields per instance.

So a value is keyed by (GPU UUID, GPU instance or none, field). Of the copies of one key the
series without a pod wins (it is the device's own value); otherwise the copies are equal and
the largest is taken (a counter or a flag never reads lower than it is). A device-wide field
that only instance series carry takes the largest of them. Per-instance fields are kept per
instance (:class:`GpuInstanceSample`) and the GPU's figure is built from them when the GPU
itself has none: framebuffer summed, engine activity averaged by compute slices.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuhealth.agent.observations import GpuIdentity, GpuInstanceSample, GpuSample
from gpuhealth.agent.sources.dcgm.fields import (
    FB_FREE,
    FB_USED,
    FIELDS,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    NVLINK_ERROR_FIELDS,
    THROTTLE_FIELDS,
    XID_FIELD,
)
from gpuhealth.agent.sources.dcgm.prom_text import iter_samples
from gpuhealth.agent.sources.nvml.device import throttle_reason_names

MIB = 1024 * 1024
BLANK = float(2**47)
"""DCGM's ``DCGM_FP64_BLANK``; it and the int64 sentinels above it mean "no value" (older
dcgm-exporters print them, e.g. 9223372036854775794 for NOT_SUPPORTED)."""
POD_LABELS = ("pod", "pod_name")
_SLICES = re.compile(r"^(\d+)g\.")


@dataclass(slots=True)
class _Pick:
    value: float
    pod_less: bool
    labels: dict[str, str]


@dataclass(slots=True)
class GpuScrape:
    """One GPU of a scrape, its copies already reduced to one value per field."""

    identity: GpuIdentity
    device: dict[str, float] = field(default_factory=dict)
    instances: dict[int, dict[str, float]] = field(default_factory=dict)
    profiles: dict[int, str] = field(default_factory=dict)
    xid_messages: dict[int | None, str] = field(default_factory=dict)
    """``err_msg`` of the XID series, per GPU instance (None: the GPU's own series)."""


@dataclass(slots=True)
class Scrape:
    gpus: dict[str, GpuScrape]
    driver_version: str | None
    fields_seen: frozenset[str]
    """Fields of :data:`FIELDS` with a value for at least one GPU."""
    copies: int
    """Series dropped as copies of another (per pod, per instance)."""


def parse_exposition(text: str) -> Scrape:
    """Parse dcgm-exporter's text (:mod:`~gpuhealth.agent.sources.dcgm.prom_text`, the lines of
    the fields the agent reads); ValueError when one of them is malformed."""
    picks: dict[tuple[str, int | None, str], _Pick] = {}
    idents: dict[str, GpuIdentity] = {}
    profiles: dict[str, dict[int, str]] = {}
    driver: str | None = None
    copies = 0
    for name, labels, value in iter_samples(text, FIELDS):
        uuid = labels.get("UUID") or labels.get("uuid")
        if not uuid or math.isnan(value) or abs(value) >= BLANK:
            continue
        if uuid not in idents:
            idents[uuid] = _identity(uuid, labels)
            driver = labels.get("DCGM_FI_DRIVER_VERSION") or driver
        instance = _instance(labels)
        if instance is not None:
            profiles.setdefault(uuid, {})[instance] = labels.get("GPU_I_PROFILE", "")
        pick = _Pick(value, not any(labels.get(k) for k in POD_LABELS), labels)
        key = (uuid, instance, name)
        old = picks.get(key)
        if old is not None:
            copies += 1
            if (old.pod_less, old.value) >= (pick.pod_less, pick.value):
                continue
        picks[key] = pick
    gpus = {
        u: GpuScrape(
            identity=_with_mig(i, bool(profiles.get(u))), profiles=dict(profiles.get(u, {}))
        )
        for u, i in idents.items()
    }
    for (uuid, instance, name), pick in picks.items():
        gpu = gpus[uuid]
        if name == XID_FIELD:
            gpu.xid_messages[instance] = pick.labels.get("err_msg", "")
        if instance is None:
            gpu.device[name] = pick.value
        else:
            gpu.instances.setdefault(instance, {})[name] = pick.value
    seen = frozenset(name for _, _, name in picks)
    return Scrape(gpus, driver, seen, copies)


def gpu_xids(gpu: GpuScrape) -> dict[int | None, tuple[int, str]]:
    """``DCGM_FI_DEV_XID_ERRORS`` of the GPU (key None) and of each MIG GPU instance that has
    its own series: the last XID (0 = none yet) and dcgm-exporter's text for it."""
    out: dict[int | None, tuple[int, str]] = {}
    if XID_FIELD in gpu.device:
        out[None] = (int(gpu.device[XID_FIELD]), gpu.xid_messages.get(None, ""))
    for gi, vals in sorted(gpu.instances.items()):
        if XID_FIELD in vals:
            out[gi] = (int(vals[XID_FIELD]), gpu.xid_messages.get(gi, ""))
    return out


def gpu_sample(gpu: GpuScrape, at: datetime) -> GpuSample:
    """The GPU's sample: device values first, then what its instances add."""
    merged = dict(gpu.device)
    for name, spec in FIELDS.items():
        if name in merged or spec.scope != "device":
            continue
        vals = [i[name] for i in gpu.instances.values() if name in i]
        if vals:
            merged[name] = max(vals)
    out: dict[str, Any] = {}
    for name, value in merged.items():
        spec = FIELDS[name]
        if spec.attr in ("xid", "nvlink_errors", "throttle_reasons") or spec.scope == "instance":
            continue
        out[spec.attr] = _convert(spec.convert, value)
    nvlink = [merged[n] for n in NVLINK_ERROR_FIELDS if n in merged]
    if nvlink:
        out["nvlink_errors"] = int(sum(nvlink))
    throttle = next((merged[n] for n in THROTTLE_FIELDS if n in merged), None)
    if throttle is not None:
        out["throttle_reasons"] = throttle_reason_names(int(throttle))
    instances = tuple(
        _instance_sample(gi, gpu.profiles.get(gi, ""), vals)
        for gi, vals in sorted(gpu.instances.items())
    )
    used, free = _memory(gpu, instances)
    if used is not None:
        out["memory_used_bytes"] = used
        if free is not None:
            out["memory_total_bytes"] = used + free
    util = _utilization(gpu, instances)
    if util is not None:
        out["utilization_ratio"] = util
    if gpu.profiles:
        out["mig_mode"] = True
        out["mig_instances"] = len(gpu.profiles)
    return GpuSample(uuid=gpu.identity.uuid, at=at, gpu_instances=instances, **out)


def _memory(
    gpu: GpuScrape, instances: tuple[GpuInstanceSample, ...]
) -> tuple[int | None, int | None]:
    used, free = gpu.device.get(FB_USED), gpu.device.get(FB_FREE)
    if used is not None:
        return int(used * MIB), None if free is None else int(free * MIB)
    parts = [i for i in instances if i.memory_used_bytes is not None]
    if not parts:
        return None, None
    total_used = sum(i.memory_used_bytes or 0 for i in parts)
    if all(i.memory_total_bytes is not None for i in parts):
        return total_used, sum(i.memory_total_bytes or 0 for i in parts) - total_used
    return total_used, None


def _utilization(gpu: GpuScrape, instances: tuple[GpuInstanceSample, ...]) -> float | None:
    if GPU_UTIL in gpu.device:
        return gpu.device[GPU_UTIL] / 100.0
    if GR_ENGINE_ACTIVE in gpu.device:
        return _ratio(gpu.device[GR_ENGINE_ACTIVE])
    parts = [(i, _slices(i.profile)) for i in instances if i.utilization_ratio is not None]
    weight = sum(w for _, w in parts)
    if not parts or weight == 0:
        return None
    return sum((i.utilization_ratio or 0.0) * w for i, w in parts) / weight


def _instance_sample(gi: int, profile: str, vals: dict[str, float]) -> GpuInstanceSample:
    used, free = vals.get(FB_USED), vals.get(FB_FREE)
    util = vals.get(GR_ENGINE_ACTIVE)
    if util is None and GPU_UTIL in vals:
        util = vals[GPU_UTIL] / 100.0
    return GpuInstanceSample(
        instance_id=gi,
        profile=profile,
        memory_used_bytes=None if used is None else int(used * MIB),
        memory_total_bytes=None if used is None or free is None else int((used + free) * MIB),
        utilization_ratio=None if util is None else _ratio(util),
    )


def _slices(profile: str) -> int:
    """Compute slices of a MIG profile (``3g.40gb`` -> 3); 1 when it does not say."""
    m = _SLICES.match(profile)
    return int(m.group(1)) if m else 1


def _ratio(v: float) -> float:
    return min(1.0, max(0.0, v))


def _convert(kind: str, v: float) -> Any:
    if kind == "int":
        return int(v)
    if kind == "bool":
        return v != 0
    if kind == "percent":
        return v / 100.0
    if kind == "mhz":
        return v * 1e6
    if kind == "mib":
        return int(v * MIB)
    if kind == "ratio":
        return _ratio(v)
    return v


def _instance(labels: dict[str, str]) -> int | None:
    raw = labels.get("GPU_I_ID")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _identity(uuid: str, labels: dict[str, str]) -> GpuIdentity:
    try:
        index = int(labels.get("gpu", "0"))
    except ValueError:
        index = 0
    return GpuIdentity(
        index=index,
        uuid=uuid,
        model=labels.get("modelName") or labels.get("model_name", ""),
        pci_bus_id=labels.get("pci_bus_id", "").upper(),
    )


def _with_mig(ident: GpuIdentity, mig: bool) -> GpuIdentity:
    if not mig:
        return ident
    return GpuIdentity(
        index=ident.index,
        uuid=ident.uuid,
        model=ident.model,
        pci_bus_id=ident.pci_bus_id,
        serial=ident.serial,
        memory_total_bytes=ident.memory_total_bytes,
        mig_enabled=True,
    )
