"""``--real-node``: the demo's first node is a real one (localkube's node harness).

The node harness brings the control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) and one real worker: containerd, a kubelet registering the node
under the demo's name, kube-proxy, CoreDNS and the test device plugin, whose
``nvidia.com/gpu`` devices carry the UUIDs the node's simulated agent reports (same scenario
and seed). kwok plays the other nodes as usual. The real node's agent runs like the others
but reads the kubelet's real PodResources socket; its agent pod (whose token it presents)
really runs, from the node's pause image.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from localkube import ControlPlane, assets_dir
from localkube.kubelet import POD_RESOURCES_SOCKET
from localkube.node import Node, NodeSettings


async def start(
    stack: contextlib.AsyncExitStack, root: Path, node: str, scenario: dict[str, Any]
) -> Node:
    """The node harness with ``node`` as its worker, entered on ``stack`` (stopped last)."""
    scenario_file = root / "real-node" / "scenario.yaml"
    scenario_file.parent.mkdir(parents=True, exist_ok=True)
    scenario_file.write_text(yaml.safe_dump(scenario, sort_keys=False))
    settings = NodeSettings(node_name=node, sim_scenario=scenario_file)
    harness = Node(assets_dir(node=True), settings, workdir=root / "real-node" / "node")
    return await stack.enter_async_context(harness)


def control_plane(node: Node) -> ControlPlane:
    assert node.control_plane is not None
    return node.control_plane


def podresources_socket(node: Node) -> Path:
    del node  # the kubelet's fixed path
    return POD_RESOURCES_SOCKET
