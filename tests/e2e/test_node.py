"""localkube's real node: real pods with simulated GPUs through the device-plugin API, the
kubelet's PodResources API reporting them, and a host left exactly as it was — after a clean
stop, after a failed start, and after a run that was killed outright."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.agent.podresources.client import PodResourcesClient
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from localkube import hoststate
from localkube.kubelet import POD_RESOURCES_SOCKET
from localkube.node import Node, NodeSettings
from localkube.process import LocalKubeError
from localkube.restapi import AdminApi

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
POD_TIMEOUT_S = 120.0


def gpu_pod(name: str, image: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def wait_running(api: AdminApi, namespace: str, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + POD_TIMEOUT_S
    while True:
        pod: dict[str, Any] = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}
        phase = pod.get("status", {}).get("phase")
        if phase == "Running":
            return pod
        assert phase != "Failed", pod["status"]
        assert time.monotonic() < deadline, f"pod {name} not Running: {pod.get('status')}"
        time.sleep(0.2)


def assert_host_restored(before: hoststate.HostState, workdir: Path) -> None:
    after = hoststate.take((str(workdir),))
    assert hoststate.leftovers(before, after, workdir=workdir) == []
    assert not workdir.exists()


def test_pods_get_simulated_gpus_that_podresources_reports(
    node_assets: Path, log: Callable[[str], None]
) -> None:
    before = hoststate.take()
    with Node(node_assets, NodeSettings(sim_seed=11), log=log) as node:
        workdir = node.workdir
        api = AdminApi(node.control_plane)
        assert (
            api.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        )
        for name, gpus in (("one", 1), ("two", 2)):
            api.request(
                "POST", "/api/v1/namespaces/default/pods", gpu_pod(name, node.pause_name, gpus)
            )
        for name in ("one", "two"):
            wait_running(api, "default", name)

        settings = PodResourcesSettings(socket=str(POD_RESOURCES_SOCKET))
        listed = asyncio.run(PodResourcesClient(settings).list())
        held: dict[tuple[str, str], list[str]] = {}
        assert listed.claims == []  # no DRA driver on this node
        for d in listed.devices:  # the kubelet lists one entry per device
            if d.namespace == "default":
                held.setdefault((d.pod, d.container), []).extend(d.device_ids)
        assert set(held) == {("one", "main"), ("two", "main")}
        assert len(held["one", "main"]) == 1 and len(held["two", "main"]) == 2
        devices = [d for ids in held.values() for d in ids]
        # The agent's simulator (seed 11) reports exactly these UUIDs; no GPU is shared.
        assert set(devices) <= set(node.gpu_uuids) and len(set(devices)) == 3
        allocated = asyncio.run(PodResourcesClient(settings).allocatable())
        assert set(allocated["nvidia.com/gpu"]) == set(node.gpu_uuids)
        records = node.device_plugin.allocations_file.read_text().splitlines()  # type: ignore[union-attr]
        assert sorted(d for r in records for d in json.loads(r)["devices"]) == sorted(devices)
    assert node.cleanup_problems == []
    assert_host_restored(before, workdir)


def test_a_failed_start_leaves_the_host_as_it_was(
    node_assets: Path, tmp_path: Path, log: Callable[[str], None]
) -> None:
    """The device plugin starts last; a scenario it cannot read fails the start after the
    control plane, containerd, the kubelet, kube-proxy (iptables) and CoreDNS run."""
    bad = tmp_path / "scenario.yaml"
    bad.write_text("gpus: lots\n")
    before = hoststate.take()
    node = Node(node_assets, NodeSettings(sim_scenario=bad), log=log)
    with pytest.raises(LocalKubeError, match="scenario"):
        node.start()
    assert node.kubelet is not None and node.kubelet.launched, "failed too early to prove much"
    assert node.cleanup_problems == []
    assert_host_restored(before, node.workdir)


KILLED_RUN = """
import sys, time
from localkube.node import Node
from localkube.restapi import AdminApi
node = Node()
node.start()
api = AdminApi(node.control_plane)
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"}, "spec": {
    "containers": [{"name": "main", "image": node.pause_name, "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
api.request("POST", "/api/v1/namespaces/default/pods", pod)
def phase():
    return (api.get("/api/v1/namespaces/default/pods/orphan") or {}).get("status", {}).get("phase")
while phase() != "Running":
    time.sleep(0.2)
print(node.workdir, flush=True)
time.sleep(3600)
"""


def test_a_killed_run_is_cleaned_up_by_the_next_one(
    node_assets: Path, log: Callable[[str], None]
) -> None:
    """SIGKILL leaves every process, mount, cgroup and chain in place; the next node finds
    the ledger and restores the host before it starts."""
    before = hoststate.take()
    env = {**os.environ, "GPUHEALTH_ASSETS": str(node_assets), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        first_workdir = Path(proc.stdout.readline().strip())
        assert first_workdir.is_dir(), "the first node did not start"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = hoststate.leftovers(before, hoststate.take((str(first_workdir),)), workdir=first_workdir)
    assert any(line.startswith("process") for line in left), left  # the kubelet and friends

    with Node(node_assets, log=log) as node:
        assert not first_workdir.exists()
        assert AdminApi(node.control_plane).get("/api/v1/namespaces/default/pods/orphan") is None
        workdir = node.workdir
    assert node.cleanup_problems == []
    assert_host_restored(before, workdir)
