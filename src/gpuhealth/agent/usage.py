"""Per-allocation GPU utilisation for heartbeats (pure).

Each GPU held by pods (PodResources allocations) gets one :class:`AllocationUsage` per
container holding it, averaged over the samples since the previous heartbeat:

- ``attribution="process"`` when NVML reported per-process utilisation and at least one of
  the GPU's processes belongs to a container holding it: each holder gets the sum over its
  own processes (a holder with no process on the GPU gets 0);
- ``attribution="gpu"`` otherwise: every holder gets the whole GPU's figure. On a shared GPU
  (time-slicing, ``UUID::N``) this over-states each pod's use, so a pod is never called idle
  because of another pod's work, only missed.

A GPU with no figure at all yields nothing (unknown is not idle). An allocation of a MIG
device (``MIG-<uuid>``, ``MIG-GPU-<uuid>/<gi>/<ci>``, a DRA ``gpu-<minor>-mig-…`` device) gets
that instance's figure from its parent GPU's sample: 0 while no process runs on the instance,
nothing otherwise (NVML has no utilisation on MIG handles), so an empty MIG slice held by a
pod is seen idle and a busy one never is.

Processes are mapped to containers by PID: ``/proc/<pid>/cgroup`` gives the container ID
(:mod:`gpuhealth.agent.cgroup`), and the kubelet's ``/var/log/containers`` symlink names
(``<pod>_<namespace>_<container>-<id>.log``) map the ID to the names PodResources uses.
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuhealth.agent.cgroup import CgroupOwner, read_owner
from gpuhealth.agent.observations import GpuSample, MigDevice
from gpuhealth.agent.podresources.devices import mig_device_for
from gpuhealth.protocol import Allocation, AllocationUsage

CONTAINER_LOG_DIR = Path("/var/log/containers")

_LOG_NAME = re.compile(
    r"^(?P<pod>[a-z0-9][a-z0-9.-]*)_(?P<ns>[a-z0-9][a-z0-9-]*)_"
    r"(?P<container>[a-z0-9][a-z0-9-]*)-(?P<id>[0-9a-f]{64})\.log$"
)


@dataclass(frozen=True, slots=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


def parse_container_log_name(name: str) -> tuple[str, ContainerRef] | None:
    """``(container_id, ref)`` from a ``/var/log/containers`` file name, else ``None``."""
    m = _LOG_NAME.match(name)
    if m is None:
        return None
    return m["id"], ContainerRef(namespace=m["ns"], pod=m["pod"], container=m["container"])


def containers_by_id(names: Iterable[str]) -> dict[str, ContainerRef]:
    out: dict[str, ContainerRef] = {}
    for name in names:
        parsed = parse_container_log_name(name)
        if parsed is not None:
            out[parsed[0]] = parsed[1]
    return out


def scan_container_logs(directory: Path = CONTAINER_LOG_DIR) -> dict[str, ContainerRef]:
    """Read the kubelet's container log directory (I/O; run off the event loop)."""
    try:
        return containers_by_id(os.listdir(directory))
    except OSError:
        return {}


def resolve_pids(
    pids: Iterable[int],
    owner_of: Callable[[int], CgroupOwner | None],
    containers: Mapping[str, ContainerRef],
) -> dict[int, ContainerRef]:
    """PID -> container for the PIDs that resolve (``owner_of`` is usually ``read_owner``)."""
    out: dict[int, ContainerRef] = {}
    for pid in pids:
        owner = owner_of(pid)
        if owner is None or owner.container_id is None:
            continue
        ref = containers.get(owner.container_id)
        if ref is not None:
            out[pid] = ref
    return out


def _ratio(x: float) -> float | None:
    if not math.isfinite(x):
        return None
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def _holders(allocations: Sequence[Allocation]) -> dict[str, list[ContainerRef]]:
    """GPU UUID -> distinct containers holding it (a container with two ``::N`` replicas of
    one GPU counts once)."""
    out: dict[str, list[ContainerRef]] = {}
    for a in allocations:
        ref = ContainerRef(namespace=a.namespace, pod=a.pod, container=a.container)
        refs = out.setdefault(a.gpu_uuid, [])
        if ref not in refs:
            refs.append(ref)
    return out


def _attribute(
    sample: GpuSample, holders: Sequence[ContainerRef], owners: Mapping[int, ContainerRef]
) -> tuple[dict[ContainerRef, float], bool] | None:
    """One sample's figure per holder, and whether it is per-process."""
    per: dict[ContainerRef, float] = {}
    for pid, util in sample.process_utilization.items():
        ref = owners.get(pid)
        if ref is not None and ref in holders:
            per[ref] = per.get(ref, 0.0) + util
    if per:
        out: dict[ContainerRef, float] = {}
        for ref in holders:
            r = _ratio(per.get(ref, 0.0))
            if r is None:
                return None
            out[ref] = r
        return out, True
    if sample.utilization_ratio is None:
        return None
    whole = _ratio(sample.utilization_ratio)
    if whole is None:
        return None
    return dict.fromkeys(holders, whole), False


def _split(
    allocations: Sequence[Allocation], mig: Sequence[MigDevice] | None
) -> tuple[list[Allocation], list[tuple[ContainerRef, MigDevice]]]:
    """Whole-GPU allocations, and MIG allocations with their instance (a GPU in MIG mode has
    no whole-GPU figure: an allocation naming no known instance gets nothing)."""
    if not mig:
        return list(allocations), []
    per_mig = []
    for a in allocations:
        m = mig_device_for(a.device_id, mig)
        if m is not None:
            per_mig.append(
                (ContainerRef(namespace=a.namespace, pod=a.pod, container=a.container), m)
            )
    return [], per_mig


def _mig_figures(per_mig: Sequence[tuple[ContainerRef, MigDevice]]) -> dict[ContainerRef, float]:
    """Per holder: the busiest of its instances; a holder with one unknown instance gets
    nothing (never idle because of the instances we can see)."""
    out: dict[ContainerRef, float] = {}
    unknown: set[ContainerRef] = set()
    for ref, m in per_mig:
        r = None if m.utilization_ratio is None else _ratio(m.utilization_ratio)
        if r is None:
            unknown.add(ref)
        else:
            out[ref] = max(out.get(ref, 0.0), r)
    return {ref: v for ref, v in out.items() if ref not in unknown}


def allocation_usage(
    allocations: Sequence[Allocation],
    samples: Iterable[GpuSample],
    owners: Mapping[int, ContainerRef],
) -> list[AllocationUsage]:
    """Average utilisation per (container, GPU) over ``samples`` (any number per GPU)."""
    by_gpu: dict[str, list[Allocation]] = {}
    for a in allocations:
        by_gpu.setdefault(a.gpu_uuid, []).append(a)
    acc: dict[tuple[str, ContainerRef], list[float]] = {}
    """(gpu, ref) -> [sum, count, all-per-process (1.0/0.0)]"""

    def add(uuid: str, figures: Mapping[ContainerRef, float], per_process: bool) -> None:
        for ref, value in figures.items():
            slot = acc.setdefault((uuid, ref), [0.0, 0.0, 1.0])
            slot[0] += value
            slot[1] += 1
            if not per_process:
                slot[2] = 0.0

    for sample in samples:
        allocs = by_gpu.get(sample.uuid)
        if not allocs:
            continue
        whole, per_mig = _split(allocs, sample.mig_devices)
        if per_mig:
            add(sample.uuid, _mig_figures(per_mig), False)
        refs = _holders(whole).get(sample.uuid)
        if not refs:
            continue
        attributed = _attribute(sample, refs, owners)
        if attributed is not None:
            add(sample.uuid, *attributed)
    return [
        AllocationUsage(
            namespace=ref.namespace,
            pod=ref.pod,
            container=ref.container,
            gpu_uuid=uuid,
            utilization_ratio=min(1.0, total / count),
            samples=int(count),
            attribution="process" if all_process else "gpu",
        )
        for (uuid, ref), (total, count, all_process) in acc.items()
    ]


PidResolver = Callable[[Iterable[int]], Mapping[int, ContainerRef]]

MAX_SAMPLES_PER_GPU = 600
"""Samples kept per GPU between two heartbeats (10 min at one poll a second)."""


def host_resolver(proc: Path = Path("/proc"), log_dir: Path = CONTAINER_LOG_DIR) -> PidResolver:
    """Resolve PIDs on this host: ``/proc/<pid>/cgroup`` plus the container log index.

    Needs ``hostPID: true`` and ``/var/log/containers`` mounted read-only. A few small file
    reads per GPU process: cheap enough to run once per heartbeat.
    """

    def resolve(pids: Iterable[int]) -> Mapping[int, ContainerRef]:
        wanted = list(pids)
        if not wanted:
            return {}
        return resolve_pids(wanted, lambda pid: read_owner(pid, proc), scan_container_logs(log_dir))

    return resolve


class UsageAccumulator:
    """Samples between heartbeats -> :class:`AllocationUsage` with the right attribution.

    Same interface as a per-GPU averager (``record`` every sample, ``drain`` at each
    heartbeat); without a resolver every figure is per GPU.
    """

    def __init__(
        self, resolver: PidResolver | None = None, max_samples_per_gpu: int = MAX_SAMPLES_PER_GPU
    ) -> None:
        self._resolver = resolver
        self._max = max_samples_per_gpu
        self._samples: dict[str, deque[GpuSample]] = {}

    def record(self, sample: GpuSample) -> None:
        q = self._samples.get(sample.uuid)
        if q is None:
            q = self._samples[sample.uuid] = deque(maxlen=self._max)
        q.append(sample)

    def drain(self, allocations: Sequence[Allocation]) -> list[AllocationUsage]:
        samples, self._samples = self._samples, {}
        flat = [s for q in samples.values() for s in q]
        owners: Mapping[int, ContainerRef] = {}
        if self._resolver is not None:
            owners = self._resolver({pid for s in flat for pid in s.process_utilization})
        return allocation_usage(allocations, flat, owners)
