"""kube-scheduler against a local control plane, optionally with scheduler extenders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

if TYPE_CHECKING:
    from localkube.controlplane import ControlPlane


@dataclass(frozen=True)
class SchedulerSettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    extra_args: tuple[str, ...] = ()


class Scheduler(Component):
    """kube-scheduler with a KubeSchedulerConfiguration file (leader election off).

    ``extenders`` is the ``extenders:`` list of the configuration, as dicts with the
    upstream field names (``urlPrefix``, ``filterVerb``, ``prioritizeVerb``, ``weight``,
    ``managedResources``, ``ignorable``, ...). ``scheduler_name`` renames the single
    profile, so pods that ask for it by ``spec.schedulerName`` are the only ones this
    scheduler sees (several schedulers can then share one cluster).
    """

    name = "scheduler"

    def __init__(
        self,
        control_plane: ControlPlane,
        extenders: list[dict[str, object]] | None = None,
        scheduler_name: str | None = None,
        settings: SchedulerSettings | None = None,
    ) -> None:
        self.settings = settings or SchedulerSettings()
        self._binary = binary(control_plane.assets, "kube-scheduler")
        # Under the control plane's directory, so its logs are found (and removed) together.
        super().__init__(
            None,
            self.settings.startup,
            self.settings.stop_grace_s,
            parent_dir=control_plane.workdir,
        )
        self.control_plane = control_plane
        self.extenders = list(extenders or [])
        self.scheduler_name = scheduler_name or "default-scheduler"
        self._new_ports()
        self.config_path = self.workdir / "scheduler.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def _new_ports(self) -> None:
        self.port = free_port()

    def config(self) -> dict[str, object]:
        cfg: dict[str, object] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            # With --config, the --kubeconfig flag is ignored: it must be set here.
            "clientConnection": {"kubeconfig": str(self.control_plane.kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": self.scheduler_name}],
        }
        if self.extenders:
            cfg["extenders"] = self.extenders
        return cfg

    def args(self) -> list[str]:
        kubeconfig = self.control_plane.kubeconfig
        args = [
            str(self._binary),
            f"--config={self.config_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--cert-dir={self.workdir / 'certs'}",
        ]
        gates = self.control_plane.settings.feature_gates
        if gates:
            args.append(f"--feature-gates={','.join(gates)}")
        return [*args, *self.settings.extra_args]

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("kube-scheduler", self.args())
        # /healthz is always allowed; the serving cert is self-signed by the scheduler.
        return proc, http_probe(
            f"https://127.0.0.1:{self.port}/healthz",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]
