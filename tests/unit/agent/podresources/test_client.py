"""The PodResources client against an in-test grpc.aio server speaking the real v1 proto."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gpuhealth.agent.observations import GpuIdentity, MigDevice
from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc
from gpuhealth.agent.podresources.client import PodResourcesClient, PodResourcesError
from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.agent.podresources.refresher import PodResourcesRefresher
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from gpuhealth.protocol import Allocation
from tests.support.clock import FakeClock
from tests.support.wait import until

GPU0 = "GPU-0b1c2d3e-0000-4000-8000-000000000000"
GPU1 = "GPU-0b1c2d3e-0000-4000-8000-000000000001"
MIG = "MIG-7a6b5c4d-0000-4000-8000-000000000009"


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.calls = 0
        self.fail: grpc.StatusCode | None = None

    async def List(self, request, context):
        self.calls += 1
        if self.fail is not None:
            await context.abort(self.fail, "kubelet says no")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request, context):
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU0]),
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU1]),
            ],
            cpu_ids=[0, 1],
        )


def pod(ns: str, name: str, *containers: tuple[str, str, list[str]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        namespace=ns,
        name=name,
        containers=[
            api_pb2.ContainerResources(
                name=c,
                devices=[api_pb2.ContainerDevices(resource_name=res, device_ids=ids)],
                cpu_ids=[2, 3],
            )
            for c, res, ids in containers
        ],
    )


@pytest.fixture
def socket_path() -> AsyncIterator[Path]:
    # A short directory: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="pr-") as d:
        yield Path(d) / "kubelet.sock"


async def _serve(path: Path, kubelet: FakeKubelet) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


def _settings(path: Path, **kw: object) -> PodResourcesSettings:
    return PodResourcesSettings(socket=str(path), call_timeout_s=2.0, **kw)  # type: ignore[arg-type]


async def test_list_maps_uuids_mig_and_time_slices(socket_path: Path) -> None:
    kubelet = FakeKubelet()
    kubelet.pods = [
        pod("ml", "train-0", ("worker", "nvidia.com/gpu", [GPU0])),
        pod(
            "ml",
            "shared",
            ("a", "nvidia.com/gpu", [f"{GPU1}::0"]),
            ("b", "nvidia.com/gpu", [f"{GPU1}::1"]),
        ),
        pod("inf", "mig-pod", ("srv", "nvidia.com/mig-1g.10gb", [MIG])),
        pod("net", "nic-pod", ("c", "example.com/sriov", ["0000:3b:00.1"])),
    ]
    server = await _serve(socket_path, kubelet)
    updates: list[list[Allocation]] = []
    ref = PodResourcesRefresher(
        _settings(socket_path),
        FakeClock(),
        updates.append,
        directory=lambda: DeviceDirectory.build(
            [GpuIdentity(index=0, uuid=GPU0, model="", pci_bus_id="")],
            {GPU0: (MigDevice(MIG, gpu_instance_id=1),)},
        ),
    )
    try:
        assert await ref.refresh_once() is True
        client = PodResourcesClient(_settings(socket_path))
        allocatable = await client.allocatable()
        await client.close()
    finally:
        await ref.close()
        await server.stop(None)
    assert ref.up and ref.errors == 0
    got = [(a.namespace, a.pod, a.container, a.gpu_uuid, a.device_id) for a in updates[-1]]
    assert got == [
        ("ml", "train-0", "worker", GPU0, GPU0),
        ("inf", "mig-pod", "srv", GPU0, MIG),
        ("ml", "shared", "a", GPU1, f"{GPU1}::0"),
        ("ml", "shared", "b", GPU1, f"{GPU1}::1"),
    ]
    assert allocatable == {"nvidia.com/gpu": (GPU0, GPU1)}


async def test_kubelet_down_keeps_cached_allocations(socket_path: Path) -> None:
    kubelet = FakeKubelet()
    kubelet.pods = [pod("ml", "train-0", ("worker", "nvidia.com/gpu", [GPU0]))]
    server = await _serve(socket_path, kubelet)
    updates: list[list[Allocation]] = []
    ref = PodResourcesRefresher(_settings(socket_path), FakeClock(), updates.append)
    try:
        assert await ref.refresh_once()
        kubelet.fail = grpc.StatusCode.UNAVAILABLE
        assert await ref.refresh_once() is False
        assert "UNAVAILABLE" in (ref.last_error or "")
        await server.stop(None)
        assert await ref.refresh_once() is False
    finally:
        await ref.close()
    assert not ref.up
    assert ref.errors == 2
    assert len(updates) == 1
    assert [a.pod for a in ref.allocations] == ["train-0"]


async def test_missing_socket_is_a_clear_error(socket_path: Path) -> None:
    ref = PodResourcesRefresher(_settings(socket_path), FakeClock(), lambda _: None)
    assert await ref.refresh_once() is False
    assert ref.last_error == f"PodResources socket {socket_path} does not exist"
    assert ref.errors == 1 and not ref.up


async def test_client_error_names_socket_and_code(socket_path: Path) -> None:
    kubelet = FakeKubelet()
    kubelet.fail = grpc.StatusCode.RESOURCE_EXHAUSTED
    server = await _serve(socket_path, kubelet)
    client = PodResourcesClient(_settings(socket_path))
    try:
        with pytest.raises(PodResourcesError, match=f"{socket_path}: RESOURCE_EXHAUSTED") as info:
            await client.list()
        assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)
    finally:
        await client.close()
        await server.stop(None)


async def test_refresh_runs_on_interval(socket_path: Path) -> None:
    import asyncio

    kubelet = FakeKubelet()
    server = await _serve(socket_path, kubelet)
    clock = FakeClock()
    ref = PodResourcesRefresher(
        _settings(socket_path, refresh_interval_s=10.0), clock, lambda _: None
    )
    task = asyncio.create_task(ref.run())
    try:
        await until(
            lambda: kubelet.calls == 1 and clock.pending_sleepers == 1,
            "the first refresh, then its sleep",
        )
        clock.advance(9.0)
        # 9 s into the 10 s interval the refresher still sleeps on the fake clock: its wake-up
        # is not due, so nothing can have happened (no wall-clock wait needed to know it)
        assert clock.pending_sleepers == 1
        assert kubelet.calls == 1
        clock.advance(1.0)
        await until(lambda: kubelet.calls == 2, "the second refresh")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


async def test_allocations_unknown_while_the_kubelet_cannot_be_read(socket_path: Path) -> None:
    """The controller is told the allocations are unknown (the kept ones may be stale), never
    "no pods", and told again once a List works."""
    told: list[str | None] = []
    ref = PodResourcesRefresher(
        _settings(socket_path), FakeClock(), lambda _: None, on_unknown=told.append
    )
    assert await ref.refresh_once() is False  # no socket yet
    assert told == [f"PodResources: PodResources socket {socket_path} does not exist"]
    assert await ref.refresh_once() is False  # the same reason: told once
    kubelet = FakeKubelet()
    server = await _serve(socket_path, kubelet)
    try:
        assert await ref.refresh_once()
        assert told[-1] is None and ref.allocations == []  # known, and no pods
        assert await ref.refresh_once()
        kubelet.fail = grpc.StatusCode.UNAVAILABLE
        assert await ref.refresh_once() is False
    finally:
        await server.stop(None)
        await ref.close()
    assert len(told) == 3 and told[-1] is not None and "UNAVAILABLE" in told[-1]
