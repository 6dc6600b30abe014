"""kwok against a local control plane: fake nodes turn Ready, bound pods turn Running."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localkube.assets import binary
from localkube.component import Component, Launch
from localkube.objects import KWOK_ANNOTATION
from localkube.process import ManagedProcess, Probe, ProbeSettings, free_port, http_probe

if TYPE_CHECKING:
    from localkube.controlplane import ControlPlane

STAGES = Path(__file__).with_name("stages.yaml")
"""kwok's "fast" Stage set: node-initialize, node-heartbeat-with-lease, pod-ready,
pod-complete, pod-delete (copied from kwok v0.8.0)."""


@dataclass(frozen=True)
class KwokSettings:
    startup: ProbeSettings = field(default_factory=ProbeSettings)
    stop_grace_s: float = 10.0
    pod_cidr: str = "10.244.0.1/16"
    """Pool kwok hands pod IPs out of (kept clear of the service range 10.0.0.0/24)."""
    node_ip: str = "10.243.0.1"
    node_lease_duration_s: int = 40
    """kwok renews a Lease per node (what the heartbeat-with-lease stage relies on)."""
    stages: Path = STAGES
    extra_args: tuple[str, ...] = ()


class Kwok(Component):
    """kwok managing only nodes annotated ``kwok.x-k8s.io/node=fake``.

    Create nodes with :func:`localkube.objects.gpu_node_body` (or the annotation yourself);
    nodes without it are left alone, so tests can mix kwok and plain nodes.
    """

    name = "kwok"

    def __init__(self, control_plane: ControlPlane, settings: KwokSettings | None = None) -> None:
        self.settings = settings or KwokSettings()
        self._binary = binary(control_plane.assets, "kwok")
        # Under the control plane's directory, so its logs are found (and removed) together.
        super().__init__(
            None,
            self.settings.startup,
            self.settings.stop_grace_s,
            parent_dir=control_plane.workdir,
        )
        self.control_plane = control_plane
        self._new_ports()

    def _new_ports(self) -> None:
        self.port = free_port()

    def args(self) -> list[str]:
        s = self.settings
        return [
            str(self._binary),
            f"--kubeconfig={self.control_plane.kubeconfig}",
            f"--config={s.stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--cidr={s.pod_cidr}",
            f"--node-ip={s.node_ip}",
            f"--node-lease-duration-seconds={s.node_lease_duration_s}",
            f"--server-address=127.0.0.1:{self.port}",
            *s.extra_args,
        ]

    def _launch(self) -> tuple[ManagedProcess, Probe]:
        proc = self._process("kwok", self.args())
        return proc, http_probe(
            f"http://127.0.0.1:{self.port}/healthz",
            request_timeout_s=self.settings.startup.request_timeout_s,
        )

    def _launches(self) -> list[Launch]:
        return [self._launch]
