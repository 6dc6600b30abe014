"""The real node's pod network: one Linux bridge, host-local IPs, nothing routed beyond.

The harness creates the bridge and its gateway address before anything starts, because the
API server binds that address (pods must reach it; 127.0.0.1 is not reachable from a pod's
network namespace). The CNI ``bridge`` plugin then attaches each pod to it. Pod traffic is
not masqueraded, so pods reach the node and each other and nothing else.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localkube.process import LocalKubeError

NETWORK_NAME = "gpuhealth-localkube"
CNI_VERSION = "1.0.0"


@dataclass(frozen=True)
class PodNetwork:
    subnet: str = "10.244.0.0/24"
    """Pod IPs; the first address is the node's (the bridge's, the API server's)."""
    bridge: str = "gpuhealth0"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway(self) -> str:
        return str(next(self.network.hosts()))


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("ip") is None:
        raise LocalKubeError("the ip command (iproute2) is not installed")
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def check_free(net: PodNetwork) -> None:
    """Refuse a bridge that exists already or a subnet the host routes somewhere else."""
    if Path(f"/sys/class/net/{net.bridge}").exists():
        raise LocalKubeError(f"network device {net.bridge} exists already (another node?)")
    for line in _ip("-4", "route", "show").stdout.splitlines():
        dest = line.split()[0]
        if dest == "default":
            continue
        try:
            routed = ipaddress.IPv4Network(dest, strict=False)
        except ValueError:
            continue
        if routed.overlaps(net.network):
            raise LocalKubeError(f"pod subnet {net.subnet} overlaps the host route {line!r}")


def create_bridge(net: PodNetwork) -> None:
    prefix = net.network.prefixlen
    for args in (
        ("link", "add", net.bridge, "type", "bridge"),
        ("addr", "add", f"{net.gateway}/{prefix}", "dev", net.bridge),
        ("link", "set", net.bridge, "up"),
    ):
        result = _ip(*args)
        if result.returncode != 0:
            raise LocalKubeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def delete_bridge(net: PodNetwork) -> None:
    if Path(f"/sys/class/net/{net.bridge}").exists():
        _ip("link", "delete", net.bridge)


def cni_conflist(net: PodNetwork, ipam_dir: Path) -> dict[str, Any]:
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.subnet, "gateway": net.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def write_cni_config(net: PodNetwork, conf_dir: Path, ipam_dir: Path) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / f"10-{NETWORK_NAME}.conflist"
    path.write_text(json.dumps(cni_conflist(net, ipam_dir), indent=2))
