"""Which ResourceSlice devices an unhealthy GPU's DeviceTaintRules select (pure).

The NVIDIA DRA driver (k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin``) publishes, per node:

- a full GPU as ``gpu-<minor>`` with attributes ``type: gpu`` and ``uuid: GPU-…``;
- a MIG device (static MIG) as ``gpu-<minor>-mig-…`` with ``type: mig``, ``uuid: MIG-…`` (its
  own UUID), ``parentUUID: GPU-…`` (the GPU it is carved from) and ``profile``;
- with partitionable devices (dynamic MIG) every possible MIG partition of a GPU, next to the
  full GPU, with ``parentUUID`` but no ``uuid`` (the MIG device does not exist until it is
  allocated).

Attributes sit in ``spec.devices[].attributes`` (``v1``, ``v1beta2``) or
``spec.devices[].basic.attributes`` (``v1beta1``); each value is typed (``{"string": …}``).
A domain-qualified name (``gpu.nvidia.com/uuid``) matches too.

A GPU-wide verdict selects the GPU's own device, every device whose parent attribute names
the GPU, and every device whose ``uuid`` is one of the GPU's MIG UUIDs as its agent reported
them (the fallback for a driver that does not publish the parent). An instance-scoped verdict
(:mod:`gpuhealth.controller.taints.mig_scope`) selects the devices of those MIG UUIDs; when none of
them is published (dynamic MIG: the slice has no MIG UUIDs) it falls back to GPU-wide, so a fault is
never left without a device taint because its instance cannot be found.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.controller.taints.policy import DeviceVerdict


@dataclass(frozen=True, slots=True)
class DeviceRef:
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class SliceDevice:
    ref: DeviceRef
    uuid: str | None
    """The device's own UUID (a GPU's ``GPU-…``, a MIG device's ``MIG-…``)."""
    parent: str | None
    """The UUID of the GPU it is carved from (MIG devices)."""


@dataclass(slots=True)
class SliceIndex:
    """A node's published devices by their UUID and by their parent GPU's UUID."""

    by_uuid: dict[str, SliceDevice] = field(default_factory=dict)
    by_parent: dict[str, list[SliceDevice]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Target:
    """One device to taint: one DeviceTaintRule."""

    ref: DeviceRef
    gpu_uuid: str
    """The unhealthy GPU (the device's parent, or the device itself)."""
    device_uuid: str | None
    """The device's own UUID when published (None: a MIG partition not created yet)."""

    @property
    def key(self) -> str:
        """What names the rule: the GPU's own device keeps the GPU UUID (the name rules had
        before MIG devices were tainted), a MIG device its UUID, else parent + device name."""
        return self.device_uuid or f"{self.gpu_uuid}-{self.ref.device}"


def _attr(attrs: dict[str, Any], name: str) -> str | None:
    for key, value in attrs.items():
        if key == name or key.endswith("/" + name):
            s = value.get("string") if isinstance(value, dict) else None
            if isinstance(s, str) and s:
                return s
    return None


def index_slices(
    slices: Iterable[dict[str, Any]], uuid_attribute: str, parent_attribute: str
) -> SliceIndex:
    """Index ResourceSlices (``v1``/``v1beta2`` and ``v1beta1`` layouts)."""
    out = SliceIndex()
    for sl in slices:
        spec = sl.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for dev in spec.get("devices") or ():
            attrs = dev.get("attributes") or (dev.get("basic") or {}).get("attributes") or {}
            if not isinstance(attrs, dict):
                continue
            uuid, parent = _attr(attrs, uuid_attribute), _attr(attrs, parent_attribute)
            if uuid is None and parent is None:
                continue
            d = SliceDevice(DeviceRef(driver, pool, str(dev.get("name", ""))), uuid, parent)
            if uuid is not None:
                out.by_uuid[uuid] = d
            if parent is not None and parent != uuid:
                out.by_parent.setdefault(parent, []).append(d)
    return out


def _target(d: SliceDevice, gpu_uuid: str) -> Target:
    return Target(d.ref, gpu_uuid, d.uuid)


def targets(verdict: DeviceVerdict, index: SliceIndex) -> list[Target]:
    """The devices ``verdict`` taints (empty: none of them is published)."""
    gpu = verdict.uuid
    if verdict.instances:
        found = [_target(index.by_uuid[u], gpu) for u in verdict.instances if u in index.by_uuid]
        if found:
            return found
    picked: list[SliceDevice] = []
    if gpu in index.by_uuid:
        picked.append(index.by_uuid[gpu])
    picked += index.by_parent.get(gpu, ())
    picked += [index.by_uuid[u] for u in verdict.mig_uuids if u in index.by_uuid]
    seen: set[DeviceRef] = set()
    out: list[Target] = []
    for d in picked:
        if d.ref not in seen:
            seen.add(d.ref)
            out.append(_target(d, gpu))
    return out


def label_value(text: str) -> str:
    """A valid label value for ``text`` (hashed when too long or odd)."""
    if len(text) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def rule_name(node: str, key: str) -> str:
    base = re.sub(r"[^a-z0-9.-]+", "-", f"gpuhealth-{node}-{key}".lower()).strip("-.")
    if len(base) <= 253:
        return base
    return "gpuhealth-" + hashlib.sha256(f"{node}/{key}".encode()).hexdigest()
