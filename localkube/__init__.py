"""A local Kubernetes cluster for tests, the demo and benchmarks (dev tooling only).

etcd + kube-apiserver (:class:`ControlPlane`), kube-scheduler (:class:`Scheduler`) and kwok
(:class:`Kwok`) run as child processes on free 127.0.0.1 ports from the binaries that
``hack/kube-binaries.sh`` builds (or ``GPUHEALTH_ASSETS`` / ``KUBEBUILDER_ASSETS``).
kube-apiserver runs the Node authorizer, RBAC and the NodeRestriction admission plugin, as
managed clusters do; :meth:`ControlPlane.node_kubeconfig` acts as a node's kubelet.

:class:`Node` (``localkube.node``) is a real single-node cluster instead: the control plane
plus kube-controller-manager, containerd, a kubelet, kube-proxy, CoreDNS and a test device
plugin, running real pods (root only; ``make e2e``).
"""

from localkube.assets import AssetsMissing, assets_dir
from localkube.controlplane import ControlPlane, ControlPlaneSettings
from localkube.kwok import Kwok, KwokSettings
from localkube.process import LocalKubeError, PortInUse, ProbeSettings
from localkube.scheduler import Scheduler, SchedulerSettings

__all__ = [
    "AssetsMissing",
    "ControlPlane",
    "ControlPlaneSettings",
    "Kwok",
    "KwokSettings",
    "LocalKubeError",
    "PortInUse",
    "ProbeSettings",
    "Scheduler",
    "SchedulerSettings",
    "assets_dir",
]
