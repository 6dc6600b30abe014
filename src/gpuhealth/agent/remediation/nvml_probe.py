"""NVML questions the executors ask (off the event loop, each with a deadline).

The NVML module is passed in (``pynvml`` in production, imported by
``gpuhealth.agent.sources.nvml.source``; a fake with the same functions in tests). Every call
runs in a worker thread between ``nvmlInit`` and ``nvmlShutdown`` (NVML counts them), under
``asyncio.wait_for``: a GPU that hangs NVML (XID 79) makes the question time out instead of
blocking the agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import PermanentError, TransientError
from gpuhealth.protocol.remediation import GpuProcess

T = TypeVar("T")
MAX_PROCESSES = 64


class UnknownGpu(PermanentError):
    """NVML does not know a GPU with that UUID (gone from the bus, or a wrong UUID)."""


class NvmlUnavailable(TransientError):
    """An NVML call failed or passed its deadline."""


class NvmlProbe:
    def __init__(self, nvml: Any, timeout_s: float, clock: Clock | None = None) -> None:
        self._nvml = nvml
        self._timeout = timeout_s
        self._clock = clock or SystemClock()

    async def _run(self, what: str, fn: Callable[[Any], T]) -> T:
        nvml = self._nvml

        def call() -> T:
            nvml.nvmlInit()
            try:
                return fn(nvml)
            finally:
                nvml.nvmlShutdown()

        try:
            return await self._clock.wait_for(asyncio.to_thread(call), self._timeout)
        except TimeoutError as exc:
            raise NvmlUnavailable(f"{what}: NVML did not answer within {self._timeout:g}s") from exc
        except UnknownGpu:
            raise
        except Exception as exc:
            if isinstance(exc, nvml.NVMLError):
                raise NvmlUnavailable(f"{what}: {exc}") from exc
            raise

    def _handle(self, nvml: Any, uuid: str) -> Any:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                raise UnknownGpu(f"no GPU {uuid}") from exc
            raise

    async def processes(self, uuid: str) -> list[GpuProcess]:
        """Every process NVML lists on the GPU (compute, graphics, MPS)."""

        def ask(nvml: Any) -> list[GpuProcess]:
            handle = self._handle(nvml, uuid)
            found: dict[int, GpuProcess] = {}
            for fn in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
                "nvmlDeviceGetMPSComputeRunningProcesses",
            ):
                getter = getattr(nvml, fn, None)
                if getter is None:
                    continue
                try:
                    procs = getter(handle)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                        continue
                    raise
                for p in procs:
                    pid = int(p.pid)
                    found.setdefault(
                        pid, GpuProcess(gpu_uuid=uuid, pid=min(max(pid, 0), 2**31 - 1))
                    )
            return sorted(found.values(), key=lambda p: p.pid)[:MAX_PROCESSES]

        return await self._run(f"processes on {uuid}", ask)

    async def mig_enabled(self, uuid: str) -> bool:
        def ask(nvml: Any) -> bool:
            handle = self._handle(nvml, uuid)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            except nvml.NVMLError:
                return False  # no MIG support on this GPU
            return bool(current)

        return await self._run(f"MIG mode of {uuid}", ask)

    async def check(self, uuid: str) -> None:
        """The GPU answers NVML: its handle, memory and temperature can be read."""

        def ask(nvml: Any) -> None:
            handle = self._handle(nvml, uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)

        await self._run(f"health of {uuid}", ask)
