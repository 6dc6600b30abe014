"""The fake NVML plus what the remediation executors ask: a handle by UUID and the
processes on a GPU (compute, graphics, MPS), with pynvml's shapes and errors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml as _real

from tests.fakes.fake_pynvml import FakeGpu, FakeHandle, FakeMigHandle, FakeNvml, h100_node


class FakeNvmlProcesses(FakeNvml):
    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.processes: dict[int, list[int]] = {}
        """GPU index -> PIDs of compute processes."""
        self.graphics: dict[int, list[int]] = {}
        self.mps_supported = False

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._check_init()
        for i, g in enumerate(self.gpus[: self.visible]):
            if g.uuid == uuid:
                if g.lost:
                    raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
                return self._handles[i]
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def _procs(self, handle: Any, fn: str, table: dict[int, list[int]]) -> list[SimpleNamespace]:
        self._dev(handle, fn)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in table.get(handle.index, [])
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        if isinstance(handle, FakeMigHandle):
            return super().nvmlDeviceGetComputeRunningProcesses(handle)
        return self._procs(handle, "nvmlDeviceGetComputeRunningProcesses", self.processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        return self._procs(handle, "nvmlDeviceGetGraphicsRunningProcesses", self.graphics)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        if not self.mps_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return self._procs(handle, "nvmlDeviceGetMPSComputeRunningProcesses", {})


def node_with_processes(n: int = 8) -> FakeNvmlProcesses:
    base = h100_node(n)
    return FakeNvmlProcesses(base.gpus)
