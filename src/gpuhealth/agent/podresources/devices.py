"""Which GPU a kubelet-reported device is on (pure): device-plugin IDs and DRA devices.

The agent's :class:`DeviceDirectory` (the GPUs NVML found, with their index and minor number,
and the MIG devices of GPUs in MIG mode) resolves:

- device-plugin IDs: a GPU UUID (``GPU-…``); a MIG UUID (``MIG-…``, through the MIG devices
  NVML reports); the older MIG form ``MIG-GPU-<uuid>/<gi>/<ci>`` (its parent is in the name);
  an index (``0``, ``1``: the plugin's ``deviceIDStrategy: index``); time-slicing's ``::<n>``
  suffix is dropped;
- DRA devices (a ``ClaimResource``: driver, pool, device name, CDI device names): a GPU or MIG
  UUID anywhere in the device name or a CDI name wins; else the NVIDIA DRA driver's names
  ``gpu-<minor>`` and ``gpu-<minor>-mig-<profile>-<start>-<size>`` (also at the end of its
  per-claim CDI names ``k8s.gpu.nvidia.com/claim=<claim-uid>-gpu-0``), matched by the GPU's
  minor number (its index where the minor is unknown); else a bare index CDI name
  (``nvidia.com/gpu=0``, nvidia-ctk's ``index`` naming).

A MIG device resolves to its parent GPU (allocations are per GPU); :func:`mig_device_for`
finds the MIG device itself among a GPU's MIG devices, for per-instance usage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuhealth.agent.observations import GpuIdentity, MigDevice

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID_TOKEN = re.compile(rf"(?:GPU|MIG)-{_UUID}", re.IGNORECASE)
"""Case-insensitive: a DRA device name is a DNS label, so a driver naming devices by UUID
writes ``gpu-6f3e…`` in lower case."""
_LEGACY_MIG = re.compile(rf"MIG-(GPU-{_UUID})/(\d+)/(\d+)")
_DRA_NAME = re.compile(r"(?:^|[-/=])gpu-(\d+)(?:-mig-(\d+)-(\d+)-(\d+))?$")
_INDEX = re.compile(r"^\d{1,4}$")


@dataclass(frozen=True, slots=True)
class DeviceDirectory:
    """The node's GPUs and MIG devices, as NVML reports them."""

    gpus: tuple[GpuIdentity, ...] = ()
    migs: Mapping[str, Sequence[MigDevice]] = field(default_factory=dict)
    """Parent GPU UUID -> its MIG devices (GPUs in MIG mode)."""

    @classmethod
    def build(
        cls, gpus: Iterable[GpuIdentity], migs: Mapping[str, Sequence[MigDevice]]
    ) -> DeviceDirectory:
        return cls(gpus=tuple(gpus), migs={u: tuple(m) for u, m in migs.items() if m})

    def mig_parents(self) -> dict[str, str]:
        """MIG UUID -> parent GPU UUID."""
        return {m.uuid: parent for parent, devs in self.migs.items() for m in devs}

    def _by_index(self, i: int) -> str | None:
        return next((g.uuid for g in self.gpus if g.index == i), None)

    def _by_minor(self, minor: int) -> str | None:
        for g in self.gpus:
            if g.minor_number == minor:
                return g.uuid
        if all(g.minor_number is None for g in self.gpus):
            return self._by_index(minor)  # no minor numbers known: NVML order is the best guess
        return None

    def _uuid_in(self, text: str) -> str | None:
        """The parent GPU of the first known GPU / MIG UUID in ``text``."""
        legacy = _LEGACY_MIG.search(text)
        if legacy is not None:
            return legacy.group(1)
        known = {g.uuid.lower(): g.uuid for g in self.gpus}
        parents = {m.lower(): p for m, p in self.mig_parents().items()}
        for m in _UUID_TOKEN.finditer(text):
            token = m.group(0).lower()
            if token in known:
                return known[token]
            if token in parents:
                return parents[token]
        return None

    def plugin_gpu(self, device_id: str) -> str:
        """The GPU UUID a device-plugin ID belongs to; the ID itself when unresolved."""
        base = device_id.split("::", 1)[0]
        if base.startswith("MIG-GPU-"):
            return base[len("MIG-") :].split("/", 1)[0]
        if base.startswith("MIG-"):
            return self.mig_parents().get(base, base)
        if _INDEX.match(base):
            return self._by_index(int(base)) or base
        return base

    def dra_gpu(self, device_name: str, cdi_devices: Sequence[str] = ()) -> str | None:
        """The GPU UUID a DRA device is on, or ``None`` when nothing names one."""
        names = (device_name, *(c.rsplit("=", 1)[-1] for c in cdi_devices))
        for text in (device_name, *cdi_devices):
            found = self._uuid_in(text)
            if found is not None:
                return found
        for name in names:
            m = _DRA_NAME.search(name)
            if m is not None:
                return self._by_minor(int(m.group(1)))
        for name in names[1:]:
            if _INDEX.match(name):
                return self._by_index(int(name))
        return None


def mig_device_for(device_id: str, devices: Sequence[MigDevice]) -> MigDevice | None:
    """The MIG device (among one GPU's) a device-plugin ID or DRA device name names."""
    if not devices:
        return None
    base = device_id.split("::", 1)[0]
    for m in _UUID_TOKEN.finditer(base):
        for d in devices:
            if d.uuid.lower() == m.group(0).lower():
                return d
    legacy = _LEGACY_MIG.search(base)
    if legacy is not None:
        gi, ci = int(legacy.group(2)), int(legacy.group(3))
        return next(
            (d for d in devices if (d.gpu_instance_id, d.compute_instance_id) == (gi, ci)), None
        )
    dra = _DRA_NAME.search(base)
    if dra is not None and dra.group(2) is not None:
        want = (int(dra.group(2)), int(dra.group(3)), int(dra.group(4)))
        return next(
            (d for d in devices if (d.profile_id, d.placement_start, d.placement_size) == want),
            None,
        )
    return None
