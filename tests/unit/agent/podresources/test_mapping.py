"""Device IDs and DRA claims -> GPU UUIDs -> containers (pure), on real ID shapes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.observations import GpuIdentity, MigDevice
from gpuhealth.agent.podresources.devices import DeviceDirectory, mig_device_for
from gpuhealth.agent.podresources.mapping import (
    ClaimDevice,
    ContainerClaim,
    ContainerDevices,
    allocations_from_claims,
    allocations_from_devices,
)

GPU = "GPU-6f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"
GPU1 = "GPU-6f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5c"
GPU2 = "GPU-6f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5d"
MIG = "MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b4"
MIG2 = "MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b5"
CLAIM_UID = "3b7f2a9c-1d4e-4f6a-8b2c-9d0e1f2a3b4c"

MIGS = (
    MigDevice(MIG, gpu_instance_id=7, compute_instance_id=0, profile_id=19, placement_start=0,
              placement_size=1),
    MigDevice(MIG2, gpu_instance_id=9, compute_instance_id=0, profile_id=15, placement_start=4,
              placement_size=2),
)  # fmt: skip
DIR = DeviceDirectory.build(
    [
        GpuIdentity(index=0, uuid=GPU, model="H100", pci_bus_id="", minor_number=0),
        # NVML index order need not be the minor-number order
        GpuIdentity(index=1, uuid=GPU1, model="H100", pci_bus_id="", minor_number=2),
        GpuIdentity(
            index=2, uuid=GPU2, model="H100", pci_bus_id="", minor_number=1, mig_enabled=True
        ),
    ],
    {GPU2: MIGS},
)


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU, GPU),
        (f"{GPU}::0", GPU),
        (f"{GPU}::17", GPU),
        (f"MIG-{GPU}/1/0", GPU),  # the plugin's pre-R470 MIG form names its parent
        (f"MIG-{GPU}/1/0::2", GPU),
        (MIG, GPU2),
        (f"{MIG2}::3", GPU2),
        ("MIG-00000000-0000-0000-0000-000000000000", "MIG-00000000-0000-0000-0000-000000000000"),
        ("0", GPU),  # deviceIDStrategy: index
        ("1", GPU1),
        ("2::1", GPU2),
        ("9", "9"),  # no such GPU: the ID itself
        ("weird", "weird"),
    ],
)
def test_plugin_ids(device_id: str, expected: str) -> None:
    assert DIR.plugin_gpu(device_id) == expected


@pytest.mark.parametrize(
    ("device", "cdi", "expected"),
    [
        # NVIDIA's DRA driver (gpu.nvidia.com): gpu-<minor>, standard CDI device names
        ("gpu-0", ["k8s.gpu.nvidia.com/device=gpu-0"], GPU),
        ("gpu-1", ["k8s.gpu.nvidia.com/device=gpu-1"], GPU2),  # minor 1 is NVML index 2
        ("gpu-2", [], GPU1),
        ("gpu-1-mig-19-0-1", ["k8s.gpu.nvidia.com/device=gpu-1-mig-19-0-1"], GPU2),
        # a claim-specific CDI device (sharing config): <claim uid>-<canonical name>
        ("gpu-0", [f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0"], GPU),
        # drivers naming devices by UUID (device name or CDI name)
        (GPU1.lower(), [], GPU1),  # a DNS-label device name: lower case
        ("dev-a", [f"nvidia.com/gpu={GPU1}"], GPU1),
        ("slice-7", [f"nvidia.com/gpu={MIG2}"], GPU2),
        ("dev-b", [f"nvidia.com/gpu=MIG-{GPU}/3/0"], GPU),
        # nvidia-ctk's index naming
        ("whatever", ["nvidia.com/gpu=1"], GPU1),
        # names nothing the agent knows
        ("gpu-9", [], None),
        ("fpga-0", ["example.com/fpga=0x1"], None),
        ("nic", [], None),
    ],
)
def test_dra_devices(device: str, cdi: list[str], expected: str | None) -> None:
    assert DIR.dra_gpu(device, cdi) == expected


def test_without_minor_numbers_the_dra_name_is_the_index() -> None:
    d = DeviceDirectory.build([GpuIdentity(index=1, uuid=GPU1, model="", pci_bus_id="")], {})
    assert d.dra_gpu("gpu-1") == GPU1


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (MIG, MIG),
        (f"{MIG2}::1", MIG2),
        (f"MIG-{GPU2}/9/0", MIG2),
        ("gpu.nvidia.com/node-a/gpu-1-mig-19-0-1", MIG),
        ("gpu.nvidia.com/node-a/gpu-1-mig-15-4-2::share-1", MIG2),
        ("gpu.nvidia.com/node-a/gpu-1-mig-15-0-2", None),
        (GPU2, None),
    ],
)
def test_mig_device_for(device_id: str, expected: str | None) -> None:
    found = mig_device_for(device_id, MIGS)
    assert (found.uuid if found else None) == expected


def _e(pod: str, resource: str, *ids: str, ns: str = "ml", ctr: str = "main") -> ContainerDevices:
    return ContainerDevices(
        namespace=ns, pod=pod, container=ctr, resource_name=resource, device_ids=ids
    )


def test_allocations_filter_sort_and_dedupe() -> None:
    entries = [
        _e("b", "nvidia.com/gpu", f"{GPU}::1"),
        _e("a", "nvidia.com/gpu", f"{GPU}::0", f"{GPU}::0"),
        _e("c", "nvidia.com/mig-1g.10gb", MIG),
        _e("d", "example.com/nic", "eth0"),
        _e("e", "nvidia.com/gpu", ""),
        _e("", "nvidia.com/gpu", GPU),
    ]
    got = allocations_from_devices(entries, ("nvidia.com/",), DIR)
    assert [(a.pod, a.gpu_uuid, a.device_id) for a in got] == [
        ("a", GPU, f"{GPU}::0"),
        ("b", GPU, f"{GPU}::1"),
        ("c", GPU2, MIG),
    ]


def _claim(pod: str, *devices: ClaimDevice, ctr: str = "main") -> ContainerClaim:
    return ContainerClaim(
        namespace="ml", pod=pod, container=ctr, claim_namespace="ml", claim_name=f"{pod}-gpu",
        devices=devices,
    )  # fmt: skip


def test_claims_map_to_gpus_and_count_the_unresolved() -> None:
    claims = [
        _claim("a", ClaimDevice("gpu.nvidia.com", "node-a", "gpu-0",
                                ("k8s.gpu.nvidia.com/device=gpu-0",))),
        _claim("b", ClaimDevice("gpu.nvidia.com", "node-a", "gpu-1-mig-19-0-1")),
        _claim("c", ClaimDevice("gpu.nvidia.com", "node-a", "gpu-2", share_id="7f3c")),
        _claim("d", ClaimDevice("gpu.nvidia.com", "node-a", "gpu-9")),  # unknown GPU
        _claim("e", ClaimDevice("dra.example.com", "node-a", "gpu-0")),  # not a GPU driver
    ]  # fmt: skip
    got, unresolved = allocations_from_claims(claims, ("gpu.nvidia.com",), DIR)
    assert [(a.pod, a.gpu_uuid, a.device_id) for a in got] == [
        ("a", GPU, "gpu.nvidia.com/node-a/gpu-0"),
        ("c", GPU1, "gpu.nvidia.com/node-a/gpu-2::7f3c"),
        ("b", GPU2, "gpu.nvidia.com/node-a/gpu-1-mig-19-0-1"),
    ]
    assert unresolved == 1


@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12), st.text(max_size=40))))
def test_allocations_never_raise(rows: list[tuple[str, str, str]]) -> None:
    entries = [_e(p, "nvidia.com/gpu", d, ns=ns) for ns, p, d in rows]
    for a in allocations_from_devices(entries, ("nvidia.com/",), DIR):
        assert a.namespace and a.pod and a.device_id


@given(st.text(max_size=80), st.lists(st.text(max_size=80), max_size=3))
def test_dra_resolution_never_raises(device: str, cdi: list[str]) -> None:
    found = DIR.dra_gpu(device, cdi)
    assert found in (None, GPU, GPU1, GPU2)
    mig_device_for(device, MIGS)
