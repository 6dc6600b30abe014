"""Device IDs -> GPU UUIDs -> containers (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.podresources.mapping import (
    ContainerDevices,
    allocations_from_devices,
    gpu_uuid_for_device,
)

GPU = "GPU-6f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"
MIG = "MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b4"


@pytest.mark.parametrize(
    ("device_id", "parents", "expected"),
    [
        (GPU, None, GPU),
        (f"{GPU}::0", None, GPU),
        (f"{GPU}::17", None, GPU),
        (f"MIG-{GPU}/1/0", None, GPU),
        (f"MIG-{GPU}/1/0::2", None, GPU),
        (MIG, None, MIG),
        (MIG, {MIG: GPU}, GPU),
        (f"{MIG}::3", {MIG: GPU}, GPU),
        ("weird", None, "weird"),
    ],
)
def test_gpu_uuid_for_device(device_id: str, parents: dict | None, expected: str) -> None:
    assert gpu_uuid_for_device(device_id, parents) == expected


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
    got = allocations_from_devices(entries, ("nvidia.com/",), {MIG: "GPU-parent"})
    assert [(a.pod, a.gpu_uuid, a.device_id) for a in got] == [
        ("a", GPU, f"{GPU}::0"),
        ("b", GPU, f"{GPU}::1"),
        ("c", "GPU-parent", MIG),
    ]


@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12), st.text(max_size=40))))
def test_allocations_never_raise(rows: list[tuple[str, str, str]]) -> None:
    entries = [_e(p, "nvidia.com/gpu", d, ns=ns) for ns, p, d in rows]
    for a in allocations_from_devices(entries, ("nvidia.com/",)):
        assert a.namespace and a.pod and a.device_id
