"""DRA device taints' pure parts: ResourceSlice matching, rule names, label values."""

from __future__ import annotations

from gpuhealth.controller.kube.dra import devices_by_uuid, label_value, rule_name


def test_devices_by_uuid_v1_and_v1beta1_layouts() -> None:
    slices = [
        {
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "p1"},
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
                    {"name": "gpu-1", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-b"}}},
                    {"name": "gpu-2", "attributes": {"index": {"int": 2}}},
                ],
            }
        },
        {
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "p2"},
                "devices": [
                    {"name": "gpu-9", "basic": {"attributes": {"uuid": {"string": "GPU-c"}}}}
                ],
            }
        },
    ]
    refs = devices_by_uuid(slices, "uuid")
    assert {u: (r.pool, r.device) for u, r in refs.items()} == {
        "GPU-a": ("p1", "gpu-0"),
        "GPU-b": ("p1", "gpu-1"),
        "GPU-c": ("p2", "gpu-9"),
    }


def test_rule_names_and_label_values_are_valid() -> None:
    assert rule_name("node-1", "GPU-ABC") == "gpuhealth-node-1-gpu-abc"
    long = rule_name("n" * 250, "GPU-1")
    assert len(long) <= 253 and long.startswith("gpuhealth-")
    assert label_value("node-1") == "node-1"
    assert len(label_value("n" * 100)) <= 63
