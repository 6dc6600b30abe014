"""NodeView: a Node's wire JSON parsed into what gpuhealth reads of it."""

from __future__ import annotations

from gpuhealth.controller.kube.node_view import NodeCondition, node_view


def test_node_view_parses_the_wire_format() -> None:
    obj = {
        "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GPUHealthy", "status": "False", "reason": "XidError", "message": "m"},
            ],
        },
    }
    v = node_view(obj)
    assert (v.name, v.resource_version, v.gpus, dict(v.labels)) == ("n1", "7", 8, {"a": "b"})
    assert v.taints == ({"key": "k", "effect": "NoSchedule"},)
    assert v.condition == NodeCondition("False", "XidError", "m")
    bare = node_view({"metadata": {"name": "x"}})
    assert bare.gpus == 0 and bare.taints == () and bare.condition is None
    assert node_view({"metadata": {}, "status": {"capacity": {"nvidia.com/gpu": "2k"}}}).gpus == 0
