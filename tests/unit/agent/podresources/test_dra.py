"""MIG, index and DRA allocations over a real unix-socket gRPC server speaking the kubelet's
v1 proto, resolved through what the NVML source (fake pynvml) reported to the health engine."""

from __future__ import annotations

from pathlib import Path

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.podresources._pb import api_pb2
from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.agent.podresources.refresher import (
    PODRESOURCES_UNRESOLVED,
    PodResourcesRefresher,
)
from gpuhealth.protocol import Allocation
from tests.fakes.fake_pynvml import FakeMig, h100_node
from tests.support.clock import FakeClock
from tests.unit.agent.podresources.test_client import FakeKubelet, _serve, _settings, socket_path
from tests.unit.agent.sources.nvml.test_source import running

__all__ = ["socket_path"]  # the fixture

MIG_A = "MIG-5f8e6a3c-1b2d-5e4f-8a9b-0c1d2e3f4a5b"
MIG_B = "MIG-7a1b2c3d-4e5f-5a6b-9c8d-7e6f5a4b3c2d"
CLAIM_UID = "3b7f2a9c-1d4e-4f6a-8b2c-9d0e1f2a3b4c"


def container(name: str, *, devices: list[tuple[str, list[str]]] = (), claims=()):  # type: ignore[no-untyped-def,assignment]
    return api_pb2.ContainerResources(
        name=name,
        devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices],
        dynamic_resources=list(claims),
    )


def claim(name: str, *resources: api_pb2.ClaimResource) -> api_pb2.DynamicResource:
    return api_pb2.DynamicResource(
        claim_name=name, claim_namespace="ml", claim_resources=list(resources)
    )


def resource(device: str, *cdi: str, driver: str = "gpu.nvidia.com", share: str | None = None):  # type: ignore[no-untyped-def]
    r = api_pb2.ClaimResource(
        driver_name=driver,
        pool_name="gpu-node-0",
        device_name=device,
        cdi_devices=[api_pb2.CDIDevice(name=c) for c in cdi],
    )
    if share is not None:
        r.share_id = share
    return r


async def directory_from_nvml() -> tuple[DeviceDirectory, list[str]]:
    """GPU 0 whole (minor 0), GPU 1 in MIG mode with two instances (minor 2), GPU 2 (minor 1)."""
    fake = h100_node(3)
    fake.gpus[1].minor, fake.gpus[2].minor = 2, 1
    g = fake.gpus[1]
    g.mig_mode = 1
    g.migs = [
        FakeMig(MIG_A, gpu_instance_id=7, profile_id=19, placement_start=0),
        FakeMig(MIG_B, gpu_instance_id=9, profile_id=15, placement_start=4, placement_size=2),
    ]
    async with running(fake) as r:
        engine = HealthEngine(HealthSettings(), r.clock)
        for o in r.got:
            engine.observe(o)
    return DeviceDirectory.build(engine.identities(), engine.mig_devices()), [
        x.uuid for x in fake.gpus
    ]


async def test_mig_index_and_dra_allocations_resolve_to_their_gpu(socket_path: Path) -> None:
    directory, (gpu0, gpu1, gpu2) = await directory_from_nvml()
    kubelet = FakeKubelet()
    kubelet.pods = [
        api_pb2.PodResources(namespace="ml", name="mig-a", containers=[
            container("w", devices=[("nvidia.com/mig-1g.10gb", [MIG_A])])]),
        api_pb2.PodResources(namespace="ml", name="mig-legacy", containers=[
            container("w", devices=[("nvidia.com/mig-3g.40gb", [f"MIG-{gpu1}/9/0"])])]),
        api_pb2.PodResources(namespace="ml", name="by-index", containers=[
            container("w", devices=[("nvidia.com/gpu", ["2"])])]),
        api_pb2.PodResources(namespace="ml", name="dra-gpu", containers=[
            container("w", claims=[claim("dra-gpu-gpu", resource(
                "gpu-1", "k8s.gpu.nvidia.com/device=gpu-1"))])]),
        api_pb2.PodResources(namespace="ml", name="dra-mig", containers=[
            container("w", claims=[claim("dra-mig-gpu", resource(
                "gpu-2-mig-15-4-2", "k8s.gpu.nvidia.com/device=gpu-2-mig-15-4-2"))])]),
        api_pb2.PodResources(namespace="ml", name="dra-shared", containers=[
            container("a", claims=[claim("shared", resource(
                "gpu-0", f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0", share="s1"))]),
            container("b", claims=[claim("shared", resource(
                "gpu-0", f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0", share="s1"))])]),
        api_pb2.PodResources(namespace="ml", name="dra-other", containers=[
            container("w", claims=[claim("nic", resource("eth-1", driver="net.example.com")),
                                   claim("gone", resource("gpu-7"))])]),
    ]  # fmt: skip
    server = await _serve(socket_path, kubelet)
    updates: list[list[Allocation]] = []
    ref = PodResourcesRefresher(
        _settings(socket_path), FakeClock(), updates.append, directory=lambda: directory
    )
    try:
        assert await ref.refresh_once()
    finally:
        await ref.close()
        await server.stop(None)
    got = {(a.pod, a.container, a.gpu_uuid, a.device_id) for a in updates[-1]}
    assert got == {
        ("mig-a", "w", gpu1, MIG_A),
        ("mig-legacy", "w", gpu1, f"MIG-{gpu1}/9/0"),
        ("by-index", "w", gpu2, "2"),
        ("dra-gpu", "w", gpu2, "gpu.nvidia.com/gpu-node-0/gpu-1"),  # minor 1 is GPU index 2
        ("dra-mig", "w", gpu1, "gpu.nvidia.com/gpu-node-0/gpu-2-mig-15-4-2"),
        ("dra-shared", "a", gpu0, "gpu.nvidia.com/gpu-node-0/gpu-0::s1"),
        ("dra-shared", "b", gpu0, "gpu.nvidia.com/gpu-node-0/gpu-0::s1"),
    }
    assert ref.counters.value(PODRESOURCES_UNRESOLVED) == 1  # gpu-7: no such GPU
