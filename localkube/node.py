"""A real single-node cluster: the local control plane plus a worker that runs real pods.

:class:`Node` starts, in order: the pod bridge, etcd + kube-apiserver (bound to the bridge's
address so pods reach it, with the ``kubernetes`` Service's endpoint published), kube-scheduler,
kube-controller-manager, containerd (pause image and the given image archives imported),
the kubelet, kube-proxy, CoreDNS and the test device plugin (``nvidia.com/gpu`` devices
carrying the simulated GPUs' UUIDs); then waits until the Node is Ready with its GPUs
allocatable. It needs root, Linux, and the tools of ``hack/system-deps.sh``.

Stopping (also after a failed or interrupted start) removes the pods, stops everything in
reverse order and then restores the host to the snapshot taken before the start
(:mod:`localkube.hostcleanup`): processes, mounts, cgroups, links, iptables, sysctls,
directories. ``cleanup_problems`` lists what could not be undone (empty when clean).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from localkube import hostcleanup, hoststate
from localkube.assets import AssetsMissing, assets_dir
from localkube.containerd import CNI_BIN_DIR, Containerd
from localkube.controllermanager import ControllerManager
from localkube.controlplane import ControlPlane, ControlPlaneSettings
from localkube.coredns import CoreDns
from localkube.deviceplugin.component import DevicePlugin
from localkube.hostlock import HostLock, Ledger
from localkube.images import archive_image_names, pause_image
from localkube.kubelet import ROOT_DIR as KUBELET_ROOT
from localkube.kubelet import Kubelet, KubeletSettings
from localkube.kubeproxy import KubeProxy
from localkube.objects import GPU_RESOURCE
from localkube.podnetwork import PodNetwork, check_free, create_bridge, write_cni_config
from localkube.process import LocalKubeError, ProbeSettings
from localkube.restapi import AdminApi
from localkube.scheduler import Scheduler

TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip", "umount")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
MOUNT_ROOTS = (str(KUBELET_ROOT), "/run/containerd", "/run/netns")
"""Besides the work directory: where the node's mounts appear."""


@dataclass(frozen=True)
class NodeSettings:
    network: PodNetwork = field(default_factory=PodNetwork)
    node_name: str = ""
    """Empty: this host's name (it must resolve; kubectl logs/exec go through it)."""
    labels: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    sim_scenario: Path | None = None
    sim_seed: int = 0
    """The agent's --sim-scenario/--sim-seed: the device plugin's GPUs get the same UUIDs."""
    images: tuple[Path, ...] = ()
    """OCI archives imported into containerd before the kubelet starts."""
    ready_timeout_s: float = 180.0
    """From the kubelet's start until the Node is Ready with its GPUs allocatable."""
    drain_timeout_s: float = 60.0
    """How long stop() waits for the kubelet to remove the pods before killing them."""
    lock_timeout_s: float = 1800.0
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    startup: ProbeSettings = field(default_factory=lambda: ProbeSettings(timeout_s=120.0))


def preflight() -> None:
    """AssetsMissing naming what this host lacks to run a node."""
    if os.geteuid() != 0:
        raise AssetsMissing("a real node needs root (containerd, kubelet, iptables, mounts)")
    missing = [
        t
        for t in TOOLS
        if shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None
    ]
    missing += [f"{CNI_BIN_DIR}/{p}" for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).is_file()]
    if missing:
        raise AssetsMissing(f"missing {', '.join(missing)} (bash hack/system-deps.sh)")


class Node:
    """Use as ``with Node() as node:`` (or ``async with``); see the module docstring."""

    def __init__(
        self,
        assets: Path | None = None,
        settings: NodeSettings | None = None,
        workdir: Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        preflight()
        self.settings = settings or NodeSettings()
        self.assets = assets if assets is not None else assets_dir(node=True)
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="localkube-node-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Sockets: a short path whatever the work directory (unix socket paths <= 107 bytes).
        self.rundir = Path(tempfile.mkdtemp(prefix="localkube-run-", dir="/tmp"))
        self.name = (self.settings.node_name or socket.gethostname()).lower()
        self.ip = self.settings.network.gateway
        self._log = log or (lambda _msg: None)
        self.pause_archive = pause_image()
        (self.pause_name,) = archive_image_names(self.pause_archive)[:1] or [""]
        if not self.pause_name:
            raise AssetsMissing(f"{self.pause_archive} names no image")
        self.ready_seconds: dict[str, float] = {}
        self.cleanup_problems: list[str] = []
        self.images: list[str] = []
        self.control_plane: ControlPlane | None = None
        self._lock = HostLock(self.settings.lock_timeout_s, on_wait=self._log)
        self._ledger = Ledger()
        self._before: hoststate.HostState | None = None
        self._steps: list[tuple[str, Callable[[], None]]] = []
        self.containerd: Containerd | None = None
        self.kubelet: Kubelet | None = None
        self.device_plugin: DevicePlugin | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None, "the node is not started"
        return self.control_plane.kubeconfig

    @property
    def gpu_uuids(self) -> list[str]:
        assert self.device_plugin is not None, "the node is not started"
        return list(self.device_plugin.uuids)

    @property
    def _markers(self) -> tuple[str, ...]:
        """What every process the node starts names on its command line."""
        return (str(self.workdir), str(self.rundir))

    def host_path(self, name: str) -> Path:
        """A fresh path in the work directory for a pod's hostPath (removed at the end)."""
        path = self.workdir / "host" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # --- start -----------------------------------------------------------------------------

    def start(self) -> Self:
        began = time.monotonic()
        self._lock.acquire()
        try:
            self._recover_stale()
            self._start(began)
        except BaseException:
            self.stop()
            raise
        return self

    def _mark(self, what: str, began: float) -> None:
        self.ready_seconds[what] = time.monotonic() - began
        self._log(f"{what} ready after {self.ready_seconds[what]:.1f}s")

    def _recover_stale(self) -> None:
        stale = self._ledger.read()
        if stale is None:
            if KUBELET_ROOT.exists():
                raise LocalKubeError(
                    f"{KUBELET_ROOT} exists: a kubelet runs on this host, or its files were left "
                    "behind; a localkube node needs the host's kubelet directory for itself"
                )
            return
        snapshot, markers, roots = stale
        self._log("a previous localkube node did not clean up; restoring the host first")
        problems = hostcleanup.restore(
            hoststate.from_json(snapshot), markers=markers, mount_roots=roots, log=self._log
        )
        if problems:
            raise LocalKubeError(f"could not clean up after a previous node: {problems}")
        for marker in markers:
            subprocess.run(["rm", "-rf", "--one-file-system", marker], check=False)
        self._ledger.remove()

    def _start(self, began: float) -> None:
        s = self.settings
        check_free(s.network)
        markers = self._markers
        roots = (*markers, *MOUNT_ROOTS)
        self._before = hoststate.take(markers)
        self._ledger.write(hoststate.to_json(self._before), markers, roots)
        create_bridge(s.network)

        cp_settings = ControlPlaneSettings(
            startup=s.startup,
            address=self.ip,
            endpoint_reconciler="lease",
            disabled_admission_plugins=("TaintNodesByCondition",),
        )
        cp = ControlPlane(self.assets, cp_settings, workdir=self.workdir / "controlplane")
        self.control_plane = cp
        self._steps.append(("control plane", cp.stop))
        cp.start()
        self._mark("control plane", began)
        scheduler = Scheduler(cp)
        self._steps.append(("kube-scheduler", scheduler.stop))
        scheduler.start()
        kcm = ControllerManager(cp, self.workdir / "kcm", cluster_cidr=s.network.subnet)
        self._steps.append(("kube-controller-manager", kcm.stop))
        kcm.start()
        self._mark("kube-controller-manager", began)

        write_cni_config(s.network, self.workdir / "cni" / "net.d", self.workdir / "cni" / "ipam")
        ctr = Containerd(
            self.workdir / "containerd",
            self.pause_name,
            self.workdir / "cni" / "net.d",
            socket_dir=self.rundir,
        )
        self.containerd = ctr
        self._steps.append(("containerd", ctr.stop))
        ctr.start()
        for archive in (self.pause_archive, *s.images):
            self.images += ctr.import_image(archive)
        self._mark("containerd and images", began)

        kubelet = Kubelet(
            cp,
            self.workdir / "kubelet",
            node_name=self.name,
            node_ip=self.ip,
            cluster_dns=self.ip,
            runtime_socket=ctr.socket,
            settings=replace(s.kubelet, labels={**s.kubelet.labels, **s.labels}),
        )
        self.kubelet = kubelet
        self._steps.append(("kubelet", self._stop_kubelet))
        kubelet.start()
        proxy = KubeProxy(
            cp,
            self.workdir / "kube-proxy",
            node_name=self.name,
            node_ip=self.ip,
            cluster_cidr=s.network.subnet,
        )
        self._steps.append(("kube-proxy", proxy.stop))
        proxy.start()
        dns = CoreDns(cp, self.workdir / "coredns", self.ip)
        self._steps.append(("coredns", dns.stop))
        dns.start()
        api = AdminApi(cp)
        plugin = DevicePlugin(
            self.workdir / "deviceplugin",
            ready=lambda: self._gpus_allocatable(api),
            scenario=s.sim_scenario,
            seed=s.sim_seed,
            startup=ProbeSettings(timeout_s=s.ready_timeout_s),
        )
        self.device_plugin = plugin
        self._steps.append(("device plugin", plugin.stop))
        plugin.start()
        self._wait(lambda: self._node_ready(api), "the Node to be Ready", s.ready_timeout_s)
        self._mark("node", began)

    def _wait(self, check: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise LocalKubeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(0.2)

    def _node(self, api: AdminApi) -> dict[str, Any] | None:
        try:
            node: dict[str, Any] | None = api.get(f"/api/v1/nodes/{self.name}")
        except LocalKubeError:
            return None
        return node

    def _gpus_allocatable(self, api: AdminApi) -> bool:
        node = self._node(api)
        assert self.device_plugin is not None
        want = str(len(self.device_plugin.uuids))
        return bool(node) and node["status"].get("allocatable", {}).get(GPU_RESOURCE) == want  # type: ignore[index]

    def _node_ready(self, api: AdminApi) -> bool:
        node = self._node(api)
        if not node:
            return False
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in node["status"].get("conditions", [])
        )
        lifecycle = [
            t for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")
        ]
        return ready and not lifecycle

    # --- stop ------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Delete every pod on the node and let the kubelet tear them down (volumes, network)."""
        cp, ctr = self.control_plane, self.containerd
        if cp is None or ctr is None or not cp.processes:
            return
        api = AdminApi(cp)
        pods = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}") or {}
        for pod in pods.get("items", []):
            meta = pod["metadata"]
            api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1},
            )
        with contextlib.suppress(LocalKubeError):
            self._wait(
                lambda: not ctr.tasks(),
                "the kubelet to stop the pods",
                self.settings.drain_timeout_s,
            )

    def _stop_kubelet(self) -> None:
        if self.kubelet is None:
            return
        if self.kubelet.processes:
            try:
                self._drain()
            except LocalKubeError as exc:
                self._log(f"drain: {exc}")
        self.kubelet.stop()

    def stop(self) -> None:
        """Stop everything (reverse order), then restore the host. Safe to call twice."""
        errors = []
        order = {"kube-controller-manager": 0, "kube-scheduler": 1}
        steps = sorted(reversed(self._steps), key=lambda s: order.get(s[0], 2))
        self._steps = []
        for what, stop in steps:
            try:
                stop()
            except Exception as exc:  # keep going: the host cleanup below must run
                errors.append(f"stopping {what}: {exc}")
        if self._before is not None:
            problems = hostcleanup.restore(
                self._before,
                markers=self._markers,
                mount_roots=(*self._markers, *MOUNT_ROOTS),
                log=self._log,
            )
            after = hoststate.take(self._markers)
            for root in (self.workdir, self.rundir):
                problems += hoststate.leftovers(self._before, after, workdir=root)
            self.cleanup_problems = sorted(set(errors + problems))
            if not problems:
                owned = [self.rundir, *([self.workdir] if self._own_workdir else [])]
                for path in owned:
                    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)
                self._ledger.remove()
            self._before = None
        else:  # never started: nothing ran, only the socket directory exists
            shutil.rmtree(self.rundir, ignore_errors=True)
        for line in self.cleanup_problems:
            self._log(f"node cleanup: {line}")
        self._lock.release()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
