"""The MIG devices of one GPU in MIG mode, read through NVML in that GPU's thread.

Each poll enumerates the MIG device handles (``nvmlDeviceGetMigDeviceHandleByIndex``; an
empty slot answers NOT_FOUND). What does not change while an instance exists (its UUID, GPU
and compute instance ids, GPU instance profile and placement) is read once per handle; the
memory in use and the compute processes are read every poll. NVML does not give utilisation
rates on MIG handles (NOT_SUPPORTED; per-instance SM activity needs GPM, not read here), so
an instance's utilisation is 0 when no process runs on it and unknown otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuhealth.agent.observations import MigDevice
from gpuhealth.agent.sources.nvml_threads import handle_key

if TYPE_CHECKING:
    from gpuhealth.agent.sources.nvml_device import NvmlGpu
Opt = Callable[..., Any]
"""``NvmlReader.opt``: one NVML call, NOT_SUPPORTED -> None (and not asked again)."""


class MigReader:
    def __init__(self, nvml: Any, opt: Opt) -> None:
        self._nvml = nvml
        self._opt = opt

    def read(self, g: NvmlGpu) -> tuple[MigDevice, ...]:
        n, opt = self._nvml, self._opt
        top = opt(g, "mig_max", n.nvmlDeviceGetMaxMigDeviceCount, g.handle)
        if top is None:
            return ()
        out: list[MigDevice] = []
        seen: dict[int, tuple[Any, MigDevice]] = {}
        for i in range(int(top)):
            mh = opt(g, "mig_dev", n.nvmlDeviceGetMigDeviceHandleByIndex, g.handle, i)
            if mh is None:
                continue
            key = handle_key(mh)
            cached = g.mig_slots.get(i)
            ident = cached[1] if cached is not None and cached[0] == key else self._identity(g, mh)
            if ident is None:
                continue
            seen[i] = (key, ident)
            out.append(self._usage(g, mh, ident))
        g.mig_slots = seen
        return tuple(out)

    def _identity(self, g: NvmlGpu, mh: Any) -> MigDevice | None:
        n, opt = self._nvml, self._opt
        uuid = opt(g, "mig_uuid", n.nvmlDeviceGetUUID, mh)
        if not uuid:
            return None
        gi = opt(g, "mig_gi", n.nvmlDeviceGetGpuInstanceId, mh)
        ci = opt(g, "mig_ci", n.nvmlDeviceGetComputeInstanceId, mh)
        profile = start = size = None
        if gi is not None:
            inst = opt(g, "mig_gi_handle", n.nvmlDeviceGetGpuInstanceById, g.handle, int(gi))
            info = None if inst is None else opt(g, "mig_gi_info", n.nvmlGpuInstanceGetInfo, inst)
            if info is not None:
                profile = int(info.profileId)
                start, size = int(info.placement.start), int(info.placement.size)
        return MigDevice(
            uuid=str(uuid),
            gpu_instance_id=None if gi is None else int(gi),
            compute_instance_id=None if ci is None else int(ci),
            profile_id=profile,
            placement_start=start,
            placement_size=size,
        )

    def _usage(self, g: NvmlGpu, mh: Any, ident: MigDevice) -> MigDevice:
        n, opt = self._nvml, self._opt
        mem = opt(g, "mig_mem", n.nvmlDeviceGetMemoryInfo, mh)
        procs = opt(g, "mig_procs", n.nvmlDeviceGetComputeRunningProcesses, mh)
        count = None if procs is None else len(procs)
        return MigDevice(
            uuid=ident.uuid,
            gpu_instance_id=ident.gpu_instance_id,
            compute_instance_id=ident.compute_instance_id,
            profile_id=ident.profile_id,
            placement_start=ident.placement_start,
            placement_size=ident.placement_size,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            processes=count,
            utilization_ratio=0.0 if count == 0 else None,
        )
