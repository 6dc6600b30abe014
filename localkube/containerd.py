"""containerd for localkube's real node: its own socket, root and state, CRI on, our CNI.

Debian 12's containerd 1.6 with runc and the CNI plugins of ``/usr/lib/cni``. Everything it
keeps (images, snapshots, task state, network namespaces, runc state) lives under the
component's work directory; only its shims' sockets go to ``/run/containerd/s`` (a path
containerd 1.6 fixes), which the node's host cleanup removes. Images come from OCI archives
(:meth:`Containerd.import_image`) — no registry is ever contacted.
"""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from localkube.assets import AssetsMissing
from localkube.component import Component, Launch
from localkube.process import LocalKubeError, ManagedProcess, Probe, ProbeSettings

NAMESPACE = "k8s.io"
"""containerd namespace of the CRI plugin (what the kubelet's pods live in)."""
CNI_BIN_DIR = Path("/usr/lib/cni")
"""Where Debian's containernetworking-plugins puts the plugins."""
IMPORT_TIMEOUT_S = 300.0
CTR_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ContainerdSettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    binary: str = "containerd"
    ctr: str = "ctr"


class Containerd(Component):
    """containerd with the CRI plugin; ``socket`` is what the kubelet connects to.

    ``sandbox_image`` is the pause image's name (import it before pods start);
    ``cni_conf_dir`` holds the node's CNI network configuration.
    """

    name = "containerd"

    def __init__(
        self,
        workdir: Path,
        sandbox_image: str,
        cni_conf_dir: Path,
        settings: ContainerdSettings | None = None,
        socket_dir: Path | None = None,
    ) -> None:
        """``socket_dir`` (default: the work directory) holds the sockets: a unix socket's
        path may not exceed 107 bytes, and a work directory can be deep."""
        self.settings = settings or ContainerdSettings()
        super().__init__(workdir, self.settings.startup, self.settings.stop_grace_s)
        self.sandbox_image = sandbox_image
        self.cni_conf_dir = cni_conf_dir
        self.socket = (socket_dir or self.workdir) / "containerd.sock"
        self.config_path = self.workdir / "config.toml"
        self.config_path.write_text(self.config())

    def config(self) -> str:
        d = self.workdir
        # restrict_oom_score_adj: without CAP_SYS_RESOURCE (these hosts) runc cannot lower a
        # container's oom_score_adj below containerd's own, and every sandbox fails with
        # "can't get final child's PID from pipe: EOF".
        return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.sandbox_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.cni_conf_dir}"
"""

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("containerd", [self.settings.binary, f"--config={self.config_path}"])
        return proc, self._serving

    def _serving(self) -> bool:
        if not self.socket.exists():
            return False
        return self._ctr("version", check=False).returncode == 0

    def _launches(self) -> list[Launch]:
        return [self._launch]

    def _ctr(
        self, *args: str, check: bool = True, timeout_s: float = CTR_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.settings.ctr, "--address", str(self.socket), "--namespace", NAMESPACE, *args]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, check=False, timeout=timeout_s
            )
        except FileNotFoundError as exc:
            raise AssetsMissing(f"{self.settings.ctr} is not installed (containerd)") from exc
        except subprocess.TimeoutExpired as exc:
            raise LocalKubeError(f"{' '.join(argv)} timed out after {timeout_s:.0f}s") from exc
        if check and result.returncode != 0:
            raise LocalKubeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        return result

    def import_image(self, archive: Path) -> list[str]:
        """Import an OCI (or docker) archive; the image names it brought."""
        if not archive.is_file():
            raise AssetsMissing(f"image archive {archive} does not exist")
        out = self._ctr("images", "import", str(archive), timeout_s=IMPORT_TIMEOUT_S).stdout
        return [line.split()[1] for line in out.splitlines() if line.startswith("unpacking ")]

    def images(self) -> list[str]:
        return self._ctr("images", "list", "--quiet").stdout.split()

    def tasks(self) -> list[str]:
        """IDs of running containers (pod sandboxes included)."""
        return list(self.task_pids())

    def task_pids(self) -> dict[str, int]:
        """Running container ID -> host PID of its init process."""
        lines = self._ctr("tasks", "list", check=False).stdout.splitlines()[1:]
        return {f[0]: int(f[1]) for f in (line.split() for line in lines) if len(f) >= 2}

    def remove_all_containers(self) -> None:
        """Kill every task and delete every container (their shims exit, rootfs unmounted)."""
        for task in self.tasks():
            self._ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
        for task in self.tasks():
            self._ctr("tasks", "delete", "--force", task, check=False)
        containers = self._ctr("containers", "list", "--quiet", check=False).stdout.split()
        for container in containers:
            self._ctr("containers", "delete", container, check=False)

    def stop(self, *, keep_workdir: bool = False) -> None:
        if self.processes and self.processes[-1].exited() is None and self.socket.exists():
            # What is left, the host cleanup kills.
            with contextlib.suppress(LocalKubeError):
                self.remove_all_containers()
        super().stop(keep_workdir=keep_workdir)
