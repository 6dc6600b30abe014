"""The simulator's GPUs behind NVML's functions and ``nvidia-smi --gpu-reset``, for the
remediation executors in ``source: sim`` (the demo, tests and benchmarks).

:class:`SimNvml` answers the questions :class:`~gpuhealth.agent.remediation.nvml_probe.NvmlProbe`
asks (handle by UUID, running processes, MIG mode, memory, temperature) from the simulated
GPUs, with NVML's error codes: an unknown UUID is ``NOT_FOUND``, a lost GPU ``GPU_IS_LOST``, a
hung GPU answers nothing until its hang ends. The probe still calls it in a worker thread with
a deadline, as it does real NVML. :func:`sim_reset_command` stands for the reset command: it
resets the simulated GPU named in the command line the way a real reset does (the volatile
ECC counts, a pending row remap or page retirement, a lost or hung GPU all clear), so the
verdict's cause is gone.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from gpuhealth.agent.remediation.command import CommandResult
from gpuhealth.agent.sources.sim.source import H100_MEMORY_BYTES, SimSource

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
HANG_POLL_S = 0.05


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class _Memory(NamedTuple):
    total: int
    free: int
    used: int


class _Process(NamedTuple):
    pid: int
    usedGpuMemory: int


class SimNvml:
    """The subset of the ``pynvml`` module the remediation executors use."""

    NVMLError = NVMLError
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, sim: SimSource) -> None:
        self._sim = sim

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        state = self._sim.gpu_state(uuid)
        if state is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        while state.hung(self._sim.elapsed()):
            time.sleep(HANG_POLL_S)  # a hung GPU: the caller's deadline ends the wait
        if state.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[_Process]:
        return [_Process(pid, 0) for pid in self._sim.processes(handle)]

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        return (0, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> _Memory:
        return _Memory(H100_MEMORY_BYTES, H100_MEMORY_BYTES, 0)

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return 40


def sim_reset_command(sim: SimSource) -> Any:
    """A :data:`~gpuhealth.agent.remediation.command.Runner` that resets the simulated GPU
    whose UUID is on the command line (the configured reset command's ``{uuid}``)."""

    async def run(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
        for arg in argv:
            if sim.reset_gpu(arg):
                return CommandResult(0, f"GPU {arg} was reset (simulated)")
        return CommandResult(1, f"no simulated GPU named in {' '.join(argv)}")

    return run
