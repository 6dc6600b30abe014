"""The test device plugin as a child process of the node harness."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuhealth.common.errors import GpuHealthError
from localkube.assets import REPO_ROOT
from localkube.component import Component, Launch
from localkube.deviceplugin.devices import sim_gpu_uuids
from localkube.process import LocalKubeError, ManagedProcess, Probe, ProbeSettings


class DevicePlugin(Component):
    """``python -m localkube.deviceplugin`` for the simulator's GPUs; ready once the kubelet
    has accepted the registration (``ready`` is given the probe that says so)."""

    name = "deviceplugin"

    def __init__(
        self,
        workdir: Path,
        ready: Probe,
        *,
        scenario: Path | None = None,
        seed: int = 0,
        resource: str = "nvidia.com/gpu",
        startup: ProbeSettings | None = None,
        stop_grace_s: float = 5.0,
    ) -> None:
        super().__init__(workdir, startup or ProbeSettings(), stop_grace_s)
        self.scenario = scenario
        self.seed = seed
        self.resource = resource
        self._ready = ready
        self.allocations_file = self.workdir / "allocations.jsonl"
        """One JSON line per Allocate the kubelet made (``{"devices": [...]}``)."""
        try:
            self.uuids = sim_gpu_uuids(scenario, seed)
        except GpuHealthError as exc:
            raise LocalKubeError(f"test device plugin: {exc}") from exc

    def args(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "localkube.deviceplugin",
            f"--resource={self.resource}",
            f"--sim-seed={self.seed}",
            f"--record={self.allocations_file}",
        ]
        if self.scenario is not None:
            args.append(f"--sim-scenario={self.scenario}")
        return args

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        return self._process("deviceplugin", self.args()), self._ready

    def _launches(self) -> list[Launch]:
        return [self._launch]

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        # Run from the repository root: localkube and gpuhealth import from there.
        proc = ManagedProcess(name, argv, self.workdir / f"{name}.log", REPO_ROOT)
        self.processes.append(proc)
        self.launched.append(proc)
        proc.start()
        return proc
