"""etcd + kube-apiserver on free 127.0.0.1 ports, with PKI, SA keys and an admin kubeconfig."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from localkube import pki
from localkube.assets import assets_dir, binary
from localkube.component import Component, Launch
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

if TYPE_CHECKING:
    from localkube.kwok import Kwok, KwokSettings
    from localkube.scheduler import Scheduler

FEATURE_GATES = ("DRADeviceTaints=true", "DRADeviceTaintRules=true")
"""Gates for DRA device taints (KEP-5055); apiserver and scheduler get the same set."""

RUNTIME_CONFIG = ("resource.k8s.io/v1beta2=true",)
"""DeviceTaintRule is served from resource.k8s.io/v1beta2 in 1.36, off by default."""

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


@dataclass(frozen=True)
class ControlPlaneSettings:
    """Knobs of the local control plane; the defaults suit tests and the demo."""

    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    feature_gates: tuple[str, ...] = FEATURE_GATES
    runtime_config: tuple[str, ...] = RUNTIME_CONFIG
    extra_apiserver_args: tuple[str, ...] = ()
    """Appended last, so they override the defaults (the apiserver takes the last value)."""
    extra_etcd_args: tuple[str, ...] = ()
    address: str = "127.0.0.1"
    """IP the apiserver binds, advertises and is reached at. A real node's pods must reach it:
    :class:`localkube.node.Node` uses its pod bridge's gateway address (never 0.0.0.0)."""
    endpoint_reconciler: str = "none"
    """``lease`` publishes ``address`` as the ``kubernetes`` Service's endpoint (what pods
    reach through 10.0.0.1); ``none`` without a real node, where the endpoint would be
    loopback, which EndpointSlice validation rejects."""
    enabled_admission_plugins: tuple[str, ...] = ("NodeRestriction",)
    """Beyond kube-apiserver's defaults, as managed clusters run it: NodeRestriction limits
    what a node's own identity (``system:node:<name>``, group ``system:nodes``) may write
    beyond what the Node authorizer lets it (no taints, no ``node-restriction.kubernetes.io/``
    labels, its own Node only); :meth:`ControlPlane.node_kubeconfig` acts as such a node."""
    disabled_admission_plugins: tuple[str, ...] = ("ServiceAccount", "TaintNodesByCondition")
    """Without kube-controller-manager nobody creates default ServiceAccounts (the
    ServiceAccount plugin would reject pods) or lifts the not-ready taint that
    TaintNodesByCondition puts on new nodes."""


class ControlPlane(Component):
    """etcd and kube-apiserver; ``kubeconfig`` is an admin (system:masters) kubeconfig.

    kube-apiserver authorizes with the Node authorizer and RBAC and admits with
    NodeRestriction on, as managed clusters run it: :meth:`node_kubeconfig` acts as a node's
    kubelet, :meth:`token_kubeconfig` as a ServiceAccount.

    Use as ``with ControlPlane() as cp:`` or ``async with ControlPlane() as cp:``; then
    ``cp.url``, ``cp.kubeconfig``, ``cp.ca_cert``, and ``cp.scheduler(...)`` / ``cp.kwok()``
    for the optional components (context managers too).
    """

    name = "controlplane"

    def __init__(
        self,
        assets: Path | None = None,
        settings: ControlPlaneSettings | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.settings = settings or ControlPlaneSettings()
        self.assets = assets if assets is not None else assets_dir()
        self._etcd = binary(self.assets, "etcd")
        self._apiserver = binary(self.assets, "kube-apiserver")
        super().__init__(workdir, self.settings.startup, self.settings.stop_grace_s)
        self.pki = pki.generate(self.workdir / "pki", extra_ips=(self.settings.address,))
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._new_ports()

    def _new_ports(self) -> None:
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        # etcd remembers its peer URL in its data dir: a retry starts from scratch.
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        self._write_kubeconfig()

    @property
    def url(self) -> str:
        return f"https://{self.settings.address}:{self.port}"

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def _write_kubeconfig(self) -> None:
        user = {
            "client-certificate": str(self.pki.admin_cert),
            "client-key": str(self.pki.admin_key),
        }
        write_kubeconfig(self.kubeconfig, self.url, self.pki.ca_cert, "admin", user)

    def node_kubeconfig(self, node: str, directory: Path | None = None) -> Path:
        """A kubeconfig that acts as node ``node``'s kubelet: user ``system:node:<node>`` in
        group ``system:nodes``, with a client certificate of this control plane's CA. The
        Node authorizer and NodeRestriction limit it as they limit a real kubelet (its own
        Node only, no taints, no ``node-restriction.kubernetes.io/`` labels, no other
        objects), so tests prove what a node can and cannot write with it; the real node's
        kubelet (:class:`localkube.kubelet.Kubelet`) authenticates with one too. Written,
        with its certificate and key, into ``directory`` (default: the workdir) as
        ``node-<node>.kubeconfig``."""
        directory = directory or self.workdir
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"node-{node}.crt", directory / f"node-{node}.key"
        pki.client_cert(self.pki, cert, key, f"system:node:{node}", "system:nodes")
        path = directory / f"node-{node}.kubeconfig"
        auth = {"client-certificate": str(cert), "client-key": str(key)}
        write_kubeconfig(path, self.url, self.pki.ca_cert, f"system:node:{node}", auth)
        return path

    def token_kubeconfig(self, token: str, name: str) -> Path:
        """A kubeconfig that authenticates with ``token`` (e.g. a ServiceAccount's), to test
        what that identity may do under RBAC. Written into the workdir as ``<name>.kubeconfig``."""
        path = self.workdir / f"{name}.kubeconfig"
        write_kubeconfig(path, self.url, self.pki.ca_cert, name, {"token": token})
        return path

    def etcd_args(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self._etcd),
            "--name=localkube",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=localkube={peer}",
            "--unsafe-no-fsync",
            *self.settings.extra_etcd_args,
        ]

    def apiserver_args(self) -> list[str]:
        p = self.pki
        args = [
            str(self._apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.settings.address}",
            f"--advertise-address={self.settings.address}",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={p.sa_public_key}",
            f"--service-account-signing-key-file={p.sa_private_key}",
            "--authorization-mode=Node,RBAC",
            f"--disable-admission-plugins={','.join(self.settings.disabled_admission_plugins)}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            f"--endpoint-reconciler-type={self.settings.endpoint_reconciler}",
            # logs/exec/port-forward on a real node: the kubelet trusts our CA's admin.
            f"--kubelet-client-certificate={p.admin_cert}",
            f"--kubelet-client-key={p.admin_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
        ]
        if self.settings.enabled_admission_plugins:
            args.append(
                f"--enable-admission-plugins={','.join(self.settings.enabled_admission_plugins)}"
            )
        if self.settings.feature_gates:
            args.append(f"--feature-gates={','.join(self.settings.feature_gates)}")
        if self.settings.runtime_config:
            args.append(f"--runtime-config={','.join(self.settings.runtime_config)}")
        return [*args, *self.settings.extra_apiserver_args]

    def admin_probe(self, path: str) -> Probe:
        """A probe for ``path`` on the apiserver, authenticated as admin."""
        return http_probe(
            self.url + path,
            ca_file=self.pki.ca_cert,
            cert=(self.pki.admin_cert, self.pki.admin_key),
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launch_etcd(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("etcd", self.etcd_args())
        return proc, http_probe(
            self.etcd_url + "/health", request_timeout_s=self.settings.startup.request_timeout_s
        )

    def _launch_apiserver(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("kube-apiserver", self.apiserver_args())
        return proc, self.admin_probe("/readyz")

    def _launches(self) -> list[Launch]:
        return [self._launch_etcd, self._launch_apiserver]

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone (SIGTERM, then SIGKILL after the grace): an API-server
        outage. etcd keeps running with the data; :meth:`start_apiserver` brings it back."""
        for proc in [p for p in self.processes if p.name == "kube-apiserver"]:
            proc.stop(self._stop_grace_s)
            self.processes.remove(proc)

    def start_apiserver(self) -> float:
        """Start kube-apiserver again on the same address and port; returns the seconds until
        it answered /readyz."""
        if any(p.name == "kube-apiserver" for p in self.processes):
            raise RuntimeError("kube-apiserver is running")
        began = time.monotonic()
        proc, probe = self._launch_apiserver()
        proc.wait_ready(probe, self._probe_settings)
        return time.monotonic() - began

    @property
    def startup_seconds(self) -> float:
        """Cold start: from start() until the apiserver answered /readyz."""
        return self.ready_seconds.get("kube-apiserver", float("nan"))

    def scheduler(
        self, extenders: list[dict[str, object]] | None = None, scheduler_name: str | None = None
    ) -> Scheduler:
        """An unstarted kube-scheduler against this control plane."""
        from localkube.scheduler import Scheduler

        return Scheduler(self, extenders=extenders, scheduler_name=scheduler_name)

    def kwok(self, settings: KwokSettings | None = None) -> Kwok:
        """An unstarted kwok against this control plane."""
        from localkube.kwok import Kwok

        return Kwok(self, settings=settings)


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, auth: dict[str, str]) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "localkube", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": "localkube", "context": {"cluster": "localkube", "user": user}}],
        "current-context": "localkube",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
