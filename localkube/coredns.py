"""CoreDNS for localkube's real node: cluster DNS (``*.svc.cluster.local``) for its pods.

It runs on the host and listens on the node's pod-network address, which the kubelet gives
pods as their nameserver; it answers only for the cluster's zones (no upstream: names
outside the cluster fail, so pods never reach beyond the node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.controlplane import ControlPlane
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

DNS_PORT = 53
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class CoreDnsSettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 5.0
    cache_s: int = 5


class CoreDns(Component):
    name = "coredns"

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        listen_ip: str,
        settings: CoreDnsSettings | None = None,
    ) -> None:
        self.settings = settings or CoreDnsSettings()
        self._binary = binary(control_plane.assets, "coredns")
        super().__init__(workdir, self.settings.startup, self.settings.stop_grace_s)
        self.control_plane = control_plane
        self.listen_ip = listen_ip
        self.corefile = self.workdir / "Corefile"
        self._new_ports()

    def _new_ports(self) -> None:
        self.health_port = free_port()
        self.ready_port = free_port()
        self.corefile.write_text(self.config())

    def config(self) -> str:
        return f""".:{DNS_PORT} {{
    bind {self.listen_ip}
    errors
    health 127.0.0.1:{self.health_port}
    ready 127.0.0.1:{self.ready_port}
    cache {self.settings.cache_s}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.control_plane.kubeconfig}
        pods insecure
    }}
}}
"""

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("coredns", [str(self._binary), "-conf", str(self.corefile)])
        # /ready turns 200 once the kubernetes plugin has synced with the API server.
        return proc, http_probe(
            f"http://127.0.0.1:{self.ready_port}/ready",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]
