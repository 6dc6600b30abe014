"""GPU reset: only when NVML lists no process on the GPU, like ``nvidia-smi -r`` requires.

Refused (nothing is done) with a reason: ``unknown-gpu`` (NVML does not know the UUID, or it
is not a whole GPU's ``GPU-`` UUID: NVML also resolves MIG device UUIDs, whose processes are
only that instance's, and ``nvidia-smi -i`` also takes indexes),
``gpu-busy`` (processes listed, their PIDs in the report), ``mig-enabled`` (MIG instances
must be destroyed first), ``nvml-unavailable`` (NVML failed or hung). Otherwise the reset
command runs for each GPU (off the event loop, with a deadline); afterwards the GPU must
answer NVML again, and ``on_reset`` tells the health engine, which clears the verdicts a
reset clears (the XID and ECC conditions of that GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuhealth.agent.remediation.command import Runner, run_command
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe, NvmlUnavailable, UnknownGpu
from gpuhealth.agent.remediation.order_results import Outcome
from gpuhealth.agent.remediation.settings import ResetCommandSettings
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import GpuProcess

log = get_logger("remediation.reset")

GPU_UUID_PREFIX = "GPU-"
"""NVML's UUID of a whole GPU (a MIG device's starts ``MIG-``)."""


class GpuResetter:
    def __init__(
        self,
        probe: NvmlProbe,
        settings: ResetCommandSettings,
        *,
        on_reset: Callable[[str], None] = lambda _uuid: None,
        run: Runner = run_command,
    ) -> None:
        self._probe = probe
        self._settings = settings
        self._on_reset = on_reset
        self._run = run

    async def reset(
        self, uuids: Sequence[str], *, committing: Callable[[], None] = lambda: None
    ) -> Outcome:
        """``committing`` is called once the checks passed, just before the first reset
        command runs (from then on a cancel cannot stop the reset)."""
        uuids = list(dict.fromkeys(uuids))  # a GPU named twice is reset once
        for uuid in uuids:
            if not uuid.startswith(GPU_UUID_PREFIX):
                return Outcome("refused", "unknown-gpu", f"{uuid!r} is not a GPU's UUID")
        busy: list[GpuProcess] = []
        try:
            for uuid in uuids:
                busy += await self._probe.processes(uuid)
                if await self._probe.mig_enabled(uuid):
                    return Outcome("refused", "mig-enabled", f"{uuid} is in MIG mode")
        except UnknownGpu as exc:
            return Outcome("refused", "unknown-gpu", str(exc))
        except NvmlUnavailable as exc:
            return Outcome("refused", "nvml-unavailable", str(exc))
        if busy:
            pids = ", ".join(f"{p.pid} on {p.gpu_uuid}" for p in busy[:8])
            return Outcome("refused", "gpu-busy", f"processes use the GPU: {pids}", tuple(busy))
        committing()
        for uuid in uuids:
            argv = tuple(a.replace("{uuid}", uuid) for a in self._settings.command)
            result = await self._run(argv, self._settings.timeout_s)
            if result.returncode != 0:
                log.warning("gpu_reset_failed", gpu=uuid, returncode=result.returncode)
                why = result.output.strip()[-500:] or f"exit status {result.returncode}"
                return Outcome("failed", "command-failed", f"{uuid}: {why}")
            try:
                await self._probe.check(uuid)
            except (UnknownGpu, NvmlUnavailable) as exc:
                return Outcome("failed", "gpu-not-back", f"{uuid} after the reset: {exc}")
            log.info("gpu_reset", gpu=uuid)
            self._on_reset(uuid)
        return Outcome("succeeded", message=f"reset {len(uuids)} GPU(s)")
