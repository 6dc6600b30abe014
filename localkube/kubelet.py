"""The kubelet of localkube's real node, against the local control plane and containerd.

It authenticates as ``system:node:<name>`` (group ``system:nodes``) with a certificate from
the control plane's CA (:meth:`localkube.controlplane.ControlPlane.node_kubeconfig`), so the
API server's Node authorizer and NodeRestriction limit it as on a real cluster (e.g. it may
only request tokens for pods bound to it, and write only its own Node, never its taints).
Its root directory is the standard ``/var/lib/kubelet``: the device-plugin API's socket
path is fixed there, and the agent's PodResources socket default is below it. Settings the
hosts need (cgroup v1, cgroupfs driver, swap) and what keeps it off the rest of the host
(its own volume-plugin and pod-log directories, no kernel-default enforcement, image GC
off) are in :meth:`config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.controlplane import ControlPlane
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

ROOT_DIR = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = ROOT_DIR / "device-plugins"
"""Fixed by the device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)."""
POD_RESOURCES_SOCKET = ROOT_DIR / "pod-resources" / "kubelet.sock"


@dataclass(frozen=True)
class KubeletSettings:
    startup: ProbeSettings = field(default_factory=lambda: ProbeSettings(timeout_s=120.0))
    stop_grace_s: float = 10.0
    labels: dict[str, str] = field(default_factory=dict)
    """Node labels the kubelet registers with (``--node-labels``)."""
    config: dict[str, Any] = field(default_factory=dict)
    """KubeletConfiguration fields laid over :meth:`Kubelet.config`."""
    extra_args: tuple[str, ...] = ()


class Kubelet(Component):
    """One kubelet registering node ``node_name`` with InternalIP ``node_ip``.

    ``cluster_dns`` is the nameserver pods get; ``runtime_socket`` containerd's.
    """

    name = "kubelet"

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        *,
        node_name: str,
        node_ip: str,
        cluster_dns: str,
        runtime_socket: Path,
        settings: KubeletSettings | None = None,
    ) -> None:
        self.settings = settings or KubeletSettings()
        self._binary = binary(control_plane.assets, "kubelet")
        super().__init__(workdir, self.settings.startup, self.settings.stop_grace_s)
        self.control_plane = control_plane
        self.node_name = node_name
        self.node_ip = node_ip
        self.cluster_dns = cluster_dns
        self.runtime_socket = runtime_socket
        self.kubeconfig = control_plane.node_kubeconfig(node_name, self.workdir)
        self.config_path = self.workdir / "kubelet.yaml"
        self._new_ports()

    def _new_ports(self) -> None:
        self.port = free_port()
        self.healthz_port = free_port()
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.control_plane.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            # cgroup v1 hosts: 1.36 refuses v1 unless told; containerd 1.6 cannot report its
            # cgroup driver, so the kubelet uses its own setting.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "clusterDNS": [self.cluster_dns],
            "clusterDomain": "cluster.local",
            "resolvConf": "",
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "protectKernelDefaults": False,
            "serializeImagePulls": False,
            # Imported images can never be pulled again: no image garbage collection.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Shared CI machines run low on disk; evict only when it is really gone.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "registerNode": True,
        }
        cfg.update(self.settings.config)
        return cfg

    def args(self) -> list[str]:
        args = [
            str(self._binary),
            f"--config={self.config_path}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={ROOT_DIR}",
            f"--node-ip={self.node_ip}",
            f"--hostname-override={self.node_name}",
            f"--cert-dir={self.workdir / 'pki'}",
        ]
        if self.settings.labels:
            labels = ",".join(f"{k}={v}" for k, v in sorted(self.settings.labels.items()))
            args.append(f"--node-labels={labels}")
        return [*args, *self.settings.extra_args]

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("kubelet", self.args())
        return proc, http_probe(
            f"http://127.0.0.1:{self.healthz_port}/healthz",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]
