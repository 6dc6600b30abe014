"""DRA device taints' pure parts: ResourceSlice indexing, which devices a verdict selects (full
GPUs and MIG devices, shaped as the NVIDIA DRA driver publishes them), rule names, label
values."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.taints.dra_devices import (
    index_slices,
    label_value,
    rule_name,
    targets,
)
from gpuhealth.controller.taints.policy import DeviceVerdict

DRIVER = "gpu.nvidia.com"
GPU0 = "GPU-5a3e8f0c-1b2d-4c6e-9f10-aa11bb22cc00"
GPU1 = "GPU-7d9c1e2f-3a4b-4c5d-8e6f-0a1b2c3d4e01"
MIG_A = "MIG-0c1d2e3f-4a5b-5c6d-9e7f-8091a2b3c4d5"  # GPU 1, GI 1 (3g.40gb)
MIG_B = "MIG-1d2e3f4a-5b6c-5d7e-8f90-a1b2c3d4e5f6"  # GPU 1, GI 2 (2g.20gb)
MIG_C = "MIG-2e3f4a5b-6c7d-5e8f-9a01-b2c3d4e5f607"  # GPU 1, GI 9 (1g.10gb)


def _s(value: str) -> dict[str, str]:
    return {"string": value}


def _gpu(minor: int, uuid: str) -> dict[str, Any]:
    """A full GPU as k8s-dra-driver-gpu's GpuInfo.GetDevice() publishes it."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": _s("gpu"),
            "uuid": _s(uuid),
            "productName": _s("NVIDIA A100-SXM4-80GB"),
            "brand": _s("Nvidia"),
            "architecture": _s("Ampere"),
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": _s(f"0000:{0x1B + minor:02x}:00.0"),
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def _mig(minor: int, profile: str, pid: int, start: int, parent: str, uuid: str | None) -> Any:
    """A MIG device as MigDeviceInfo.GetDevice() (static MIG: its own ``uuid``) or a
    partition as MigSpec.PartGetDevice() (dynamic MIG: no ``uuid``) publishes it."""
    attrs: dict[str, Any] = {
        "type": _s("mig"),
        "parentUUID": _s(parent),
        "profile": _s(profile),
        "productName": _s("NVIDIA A100-SXM4-80GB"),
        "cudaComputeCapability": {"version": "8.0.0"},
        "resource.kubernetes.io/pciBusID": _s(f"0000:{0x1B + minor:02x}:00.0"),
    }
    if uuid is not None:
        attrs["uuid"] = _s(uuid)
    name = f"gpu-{minor}-mig-{profile.replace('.', '')}-{pid}-{start}"
    return {"name": name, "attributes": attrs, "capacity": {"multiprocessors": {"value": "42"}}}


def _slice(node: str, *devices: dict[str, Any], basic: bool = False) -> dict[str, Any]:
    if basic:  # v1beta1: attributes under "basic"
        devices = tuple(
            {"name": d["name"], "basic": {"attributes": d["attributes"]}} for d in devices
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-x7k2p"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


STATIC_MIG = _slice(
    "n1",
    _gpu(0, GPU0),
    _mig(1, "3g.40gb", 9, 0, GPU1, MIG_A),
    _mig(1, "2g.20gb", 14, 4, GPU1, MIG_B),
    _mig(1, "1g.10gb", 19, 6, GPU1, MIG_C),
)
# partitionable devices: the full GPU next to every possible partition, none created yet
DYNAMIC_MIG = _slice(
    "n1",
    _gpu(0, GPU0),
    _gpu(1, GPU1),
    _mig(1, "3g.40gb", 9, 0, GPU1, None),
    _mig(1, "3g.40gb", 9, 4, GPU1, None),
    _mig(1, "7g.80gb", 0, 0, GPU1, None),
)
# a driver that publishes MIG devices with their own UUID but without the parent's
NO_PARENT = _slice(
    "n1",
    {"name": "gpu-0", "attributes": {"uuid": _s(GPU0)}},
    {"name": "mig-a", "attributes": {f"{DRIVER}/uuid": _s(MIG_A)}},
    {"name": "mig-b", "attributes": {"uuid": _s(MIG_B)}},
)

GPU1_WIDE = DeviceVerdict(GPU1, 1, "xid-79", mig_uuids=(MIG_A, MIG_B, MIG_C))
GPU1_GI2 = DeviceVerdict(GPU1, 1, "xid-999", mig_uuids=(MIG_A, MIG_B, MIG_C), instances=(MIG_B,))


@pytest.mark.parametrize(
    ("slices", "verdict", "expected"),
    [
        pytest.param(
            [STATIC_MIG], DeviceVerdict(GPU0, 0, "ecc-dbe"), {"gpu-0": GPU0}, id="full-gpu"
        ),
        pytest.param(
            [STATIC_MIG],
            GPU1_WIDE,
            {
                "gpu-1-mig-3g40gb-9-0": MIG_A,
                "gpu-1-mig-2g20gb-14-4": MIG_B,
                "gpu-1-mig-1g10gb-19-6": MIG_C,
            },
            id="static-mig-every-mig-device-by-parentUUID",
        ),
        pytest.param(
            [STATIC_MIG],
            DeviceVerdict(GPU1, 1, "xid-79"),  # an old agent: no MIG devices reported
            {
                "gpu-1-mig-3g40gb-9-0": MIG_A,
                "gpu-1-mig-2g20gb-14-4": MIG_B,
                "gpu-1-mig-1g10gb-19-6": MIG_C,
            },
            id="static-mig-parent-from-the-slice-alone",
        ),
        pytest.param([STATIC_MIG], GPU1_GI2, {"gpu-1-mig-2g20gb-14-4": MIG_B}, id="instance-scope"),
        pytest.param(
            [DYNAMIC_MIG],
            GPU1_WIDE,
            {
                "gpu-1": GPU1,
                "gpu-1-mig-3g40gb-9-0": None,
                "gpu-1-mig-3g40gb-9-4": None,
                "gpu-1-mig-7g80gb-0-0": None,
            },
            id="dynamic-mig-full-gpu-and-every-partition",
        ),
        pytest.param(
            [DYNAMIC_MIG],
            GPU1_GI2,
            {
                "gpu-1": GPU1,
                "gpu-1-mig-3g40gb-9-0": None,
                "gpu-1-mig-3g40gb-9-4": None,
                "gpu-1-mig-7g80gb-0-0": None,
            },
            id="instance-not-published-falls-back-to-gpu-wide",
        ),
        pytest.param(
            [NO_PARENT],
            DeviceVerdict(GPU0, 0, "xid-79", mig_uuids=(MIG_A, MIG_B)),
            {"gpu-0": GPU0, "mig-a": MIG_A, "mig-b": MIG_B},
            id="no-parent-attribute-agent-mig-devices-fallback",
        ),
        pytest.param(
            [_slice("n1", _mig(1, "3g.40gb", 9, 0, GPU1, MIG_A), basic=True)],
            GPU1_WIDE,
            {"gpu-1-mig-3g40gb-9-0": MIG_A},
            id="v1beta1-basic-layout",
        ),
        pytest.param([_slice("n1", _gpu(0, GPU0))], GPU1_WIDE, {}, id="gpu-not-published"),
        pytest.param([], GPU1_WIDE, {}, id="no-slices"),
    ],
)
def test_devices_a_verdict_selects(
    slices: list[dict[str, Any]], verdict: DeviceVerdict, expected: dict[str, str | None]
) -> None:
    found = targets(verdict, index_slices(slices, "uuid", "parentUUID"))
    assert {t.ref.device: t.device_uuid for t in found} == expected
    assert len(found) == len(expected)  # each device once
    assert all(t.gpu_uuid == verdict.uuid and t.ref.driver == DRIVER for t in found)
    assert all(t.ref.pool == "n1" for t in found)


def test_rule_keys_are_unique_and_keep_the_gpu_rule_name() -> None:
    """The full GPU's rule keeps its name from before MIG support (upgrades do not churn);
    every device of a GPU gets its own rule name."""
    found = targets(GPU1_WIDE, index_slices([DYNAMIC_MIG], "uuid", "parentUUID"))
    names = [rule_name("n1", t.key) for t in found]
    assert len(set(names)) == len(found) == 4
    assert rule_name("n1", GPU1) in names
    static = targets(GPU1_WIDE, index_slices([STATIC_MIG], "uuid", "parentUUID"))
    assert {rule_name("n1", t.key) for t in static} == {
        rule_name("n1", u) for u in (MIG_A, MIG_B, MIG_C)
    }


def test_custom_attribute_names() -> None:
    sl = _slice(
        "n1",
        {"name": "d0", "attributes": {"example.com/gpuUUID": _s(GPU1)}},
        {"name": "d1", "attributes": {"gpuUUID": _s(MIG_A), "owner": _s(GPU1)}},
    )
    found = targets(DeviceVerdict(GPU1, 1, "x"), index_slices([sl], "gpuUUID", "owner"))
    assert sorted(t.ref.device for t in found) == ["d0", "d1"]


def test_odd_slices_do_not_break_the_index() -> None:
    odd = [
        {},
        {"spec": None},
        {"spec": {"devices": [{"name": "x"}, {"name": "y", "attributes": None}]}},
        {"spec": {"devices": [{"name": "z", "attributes": {"uuid": {"int": 3}}}]}},
        {"spec": {"devices": [{"name": "w", "attributes": {"uuid": "GPU-bare-string"}}]}},
    ]
    index = index_slices(odd, "uuid", "parentUUID")
    assert index.by_uuid == {} and index.by_parent == {}


def test_rule_names_and_label_values_are_valid() -> None:
    assert rule_name("node-1", "GPU-ABC") == "gpuhealth-node-1-gpu-abc"
    long = rule_name("n" * 250, "GPU-1")
    assert len(long) <= 253 and long.startswith("gpuhealth-")
    assert label_value("node-1") == "node-1"
    assert len(label_value("n" * 100)) <= 63
