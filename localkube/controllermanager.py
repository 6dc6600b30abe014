"""kube-controller-manager against a local control plane: what a real node's workloads need
(Deployments, ReplicaSets, DaemonSets, EndpointSlices for Services, default ServiceAccounts,
garbage collection, namespace deletion, node lifecycle). It signs ServiceAccount tokens with
the control plane's key and publishes its CA as ``kube-root-ca.crt`` in every namespace."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.controlplane import SERVICE_CLUSTER_IP_RANGE, ControlPlane
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe


@dataclass(frozen=True)
class ControllerManagerSettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    controllers: str = "*"
    """``--controllers``: every default one."""
    extra_args: tuple[str, ...] = ()


class ControllerManager(Component):
    name = "kube-controller-manager"

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path | None = None,
        cluster_cidr: str = "",
        settings: ControllerManagerSettings | None = None,
    ) -> None:
        self.settings = settings or ControllerManagerSettings()
        self._binary = binary(control_plane.assets, "kube-controller-manager")
        super().__init__(
            workdir,
            self.settings.startup,
            self.settings.stop_grace_s,
            parent_dir=control_plane.workdir,
        )
        self.control_plane = control_plane
        self.cluster_cidr = cluster_cidr
        self._new_ports()

    def _new_ports(self) -> None:
        self.port = free_port()

    def args(self) -> list[str]:
        cp = self.control_plane
        kubeconfig = cp.kubeconfig
        args = [
            str(self._binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'certs'}",
            "--leader-elect=false",
            f"--controllers={self.settings.controllers}",
            f"--service-account-private-key-file={cp.pki.sa_private_key}",
            f"--root-ca-file={cp.pki.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # One identity (admin) for every controller: no per-controller ServiceAccounts.
            "--use-service-account-credentials=false",
            "--profiling=false",
        ]
        if self.cluster_cidr:
            args.append(f"--cluster-cidr={self.cluster_cidr}")
        gates = cp.settings.feature_gates
        if gates:
            args.append(f"--feature-gates={','.join(gates)}")
        return [*args, *self.settings.extra_args]

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("kube-controller-manager", self.args())
        return proc, http_probe(
            f"https://127.0.0.1:{self.port}/healthz",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]
