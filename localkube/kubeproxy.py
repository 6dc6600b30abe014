"""kube-proxy (iptables mode) for localkube's real node: Service IPs reach pods and the API
server. Configured to leave the host's kernel settings alone (no conntrack sizing, no
localhost NodePorts); :meth:`KubeProxy.stop` runs ``kube-proxy --cleanup`` to remove its
iptables chains."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.controlplane import ControlPlane
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

CLEANUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KubeProxySettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    sync_period: str = "5s"
    extra_args: tuple[str, ...] = ()


class KubeProxy(Component):
    name = "kube-proxy"

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        *,
        node_name: str,
        node_ip: str,
        cluster_cidr: str,
        settings: KubeProxySettings | None = None,
    ) -> None:
        self.settings = settings or KubeProxySettings()
        self._binary = binary(control_plane.assets, "kube-proxy")
        super().__init__(workdir, self.settings.startup, self.settings.stop_grace_s)
        self.control_plane = control_plane
        self.node_name = node_name
        self.node_ip = node_ip
        self.cluster_cidr = cluster_cidr
        self.config_path = self.workdir / "kube-proxy.yaml"
        self._new_ports()

    def _new_ports(self) -> None:
        self.healthz_port = free_port()
        self.metrics_port = free_port()
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.control_plane.kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": self.node_name,
            "clusterCIDR": self.cluster_cidr,
            "healthzBindAddress": f"127.0.0.1:{self.healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{self.metrics_port}",
            # NodePorts only on the node's own pod-network address, never on localhost
            # (that would need net.ipv4.conf.all.route_localnet=1).
            "nodePortAddresses": [f"{self.node_ip}/32"],
            "iptables": {
                # Pod -> Service -> pod on the same bridge works without br_netfilter.
                "masqueradeAll": True,
                "localhostNodePorts": False,
                "syncPeriod": self.settings.sync_period,
                "minSyncPeriod": "0s",
            },
            # Zero: leave nf_conntrack_max and the TCP timeouts as the host has them.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process(
            "kube-proxy",
            [str(self._binary), f"--config={self.config_path}", *self.settings.extra_args],
        )
        return proc, http_probe(
            f"http://127.0.0.1:{self.healthz_port}/healthz",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]

    def stop(self, *, keep_workdir: bool = False) -> None:
        """Stop it, then remove its iptables chains (``kube-proxy --cleanup``)."""
        started = bool(self.launched)
        super().stop(keep_workdir=keep_workdir)
        if started:
            self.workdir.mkdir(parents=True, exist_ok=True)
            with (self.workdir / "kube-proxy-cleanup.log").open("wb") as out:
                subprocess.run(
                    [str(self._binary), "--cleanup"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=CLEANUP_TIMEOUT_S,
                    check=False,
                )
