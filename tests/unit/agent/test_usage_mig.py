"""Per-allocation usage of MIG devices: device-plugin and DRA forms, idle when empty."""

from __future__ import annotations

import pytest

from gpuhealth.agent.observations import GpuSample, MigDevice
from gpuhealth.agent.usage import ContainerRef, allocation_usage
from gpuhealth.protocol import Allocation
from tests.unit.agent.test_usage import OWNERS, A, B, T, as_table

P = "GPU-6f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"
M1 = "MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b4"
M2 = "MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b5"


def alloc(ref: ContainerRef, device: str) -> Allocation:
    return Allocation(
        namespace=ref.namespace, pod=ref.pod, container=ref.container, gpu_uuid=P, device_id=device
    )


def mig(uuid: str, gi: int, busy: bool, profile: int = 19, start: int = 0) -> MigDevice:
    return MigDevice(
        uuid=uuid, gpu_instance_id=gi, compute_instance_id=0, profile_id=profile,
        placement_start=start, placement_size=1, processes=1 if busy else 0,
        utilization_ratio=None if busy else 0.0,
    )  # fmt: skip


def parent(*devices: MigDevice) -> GpuSample:
    # a GPU in MIG mode: NVML gives no utilisation for the GPU itself
    return GpuSample(uuid=P, at=T, utilization_ratio=None, mig_mode=True, mig_devices=devices)


@pytest.mark.parametrize(
    ("name", "allocs", "samples", "want"),
    [
        (
            "an empty MIG slice is idle, a busy one unknown",
            [alloc(A, M1), alloc(B, M2)],
            [parent(mig(M1, 7, False), mig(M2, 9, True))] * 3,
            {("train-0", P): (0.0, "gpu", 3)},
        ),
        (
            "the older MIG-GPU-<uuid>/<gi>/<ci> form",
            [alloc(A, f"MIG-{P}/7/0")],
            [parent(mig(M1, 7, False))],
            {("train-0", P): (0.0, "gpu", 1)},
        ),
        (
            "a DRA MIG device by profile and placement",
            [alloc(A, "gpu.nvidia.com/node-a/gpu-0-mig-19-3-1")],
            [parent(mig(M1, 7, False, start=3), mig(M2, 9, True, start=0))],
            {("train-0", P): (0.0, "gpu", 1)},
        ),
        (
            "two slices of one GPU: one busy makes the holder not idle",
            [alloc(A, M1), alloc(A, M2)],
            [parent(mig(M1, 7, False), mig(M2, 9, True))],
            {},
        ),
        (
            "a slice that went busy between samples: no figure for that sample",
            [alloc(A, M1)],
            [parent(mig(M1, 7, False)), parent(mig(M1, 7, True)), parent(mig(M1, 7, False))],
            {("train-0", P): (0.0, "gpu", 2)},
        ),
        (
            "an instance the GPU no longer has: nothing",
            [alloc(A, M2)],
            [parent(mig(M1, 7, False))],
            {},
        ),
    ],
)
def test_mig_usage(
    name: str,
    allocs: list[Allocation],
    samples: list[GpuSample],
    want: dict[tuple[str, str], tuple[float, str, int]],
) -> None:
    assert as_table(allocation_usage(allocs, samples, OWNERS)) == want
