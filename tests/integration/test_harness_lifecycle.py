"""The harness itself: DRA device taints are served, and no process outlives a failure."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from gpuhealth.controller.kube.client import make_api_client
from localkube import ControlPlane, ControlPlaneSettings, LocalKubeError
from localkube.process import ManagedProcess

pytestmark = pytest.mark.integration


def _all_exited(procs: list[ManagedProcess]) -> bool:
    return all(p.exited() is not None for p in procs)


async def test_device_taint_rules_are_served(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> None:
    """The feature gates and runtime-config make resource.k8s.io/v1beta2 DeviceTaintRule work."""
    resource = client.ResourceV1beta2Api(api_client)
    name = unique_name("rule")
    body = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"},
            "taint": {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"},
        },
    }
    created = await resource.create_device_taint_rule(body)
    try:
        assert created.spec.taint.key == "gpuhealth.io/unhealthy"
        assert created.spec.device_selector.device == "gpu-3"
    finally:
        await resource.delete_device_taint_rule(name)


def test_failed_start_stops_etcd_and_shows_the_log(kube_assets: Path) -> None:
    settings = ControlPlaneSettings(extra_apiserver_args=("--no-such-flag=1",))
    cp = ControlPlane(kube_assets, settings=settings)
    try:
        with pytest.raises(LocalKubeError, match="kube-apiserver exited") as failed:
            cp.start()
        assert "no-such-flag" in str(failed.value)  # the log tail is in the message
        assert [p.name for p in cp.launched] == ["etcd", "kube-apiserver"]
        assert _all_exited(cp.launched)
        assert cp.processes == []
        assert (cp.workdir / "kube-apiserver.log").is_file()  # kept for a look
    finally:
        shutil.rmtree(cp.workdir, ignore_errors=True)


async def test_async_start_retries_a_taken_port_and_stops(kube_assets: Path) -> None:
    cp = ControlPlane(kube_assets)
    taken = cp.port
    with socket.socket() as squatter:  # someone grabs the port we picked as free
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        async with cp:
            procs = list(cp.processes)
            assert [p.name for p in procs] == ["etcd", "kube-apiserver"]
            assert cp.port != taken
            assert [p.name for p in cp.launched].count("kube-apiserver") == 2
            api = await make_api_client(str(cp.kubeconfig))
            try:
                version = await client.VersionApi(api).get_code()
                assert version.git_version.startswith("v1.")
            finally:
                await api.close()
    assert _all_exited(cp.launched)
    assert not cp.workdir.exists()


async def test_cancelled_start_stops_what_was_started(kube_assets: Path) -> None:
    cp = ControlPlane(kube_assets)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(cp.astart(), timeout=0.5)
    assert cp.processes == []
    assert cp.launched and _all_exited(cp.launched)
    shutil.rmtree(cp.workdir, ignore_errors=True)
