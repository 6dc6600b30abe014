"""NodeView: a Node's wire JSON parsed into what gpuhealth reads of it."""

from __future__ import annotations

import pytest

from gpuhealth.controller.kube.node_view import NodeCondition, node_view, taints_manager


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


def entry(manager: str, fields: dict[str, object], subresource: str = "") -> dict[str, object]:
    out: dict[str, object] = {"manager": manager, "operation": "Update", "fieldsV1": fields}
    if subresource:
        out["subresource"] = subresource
    return out


TAINTS = {"f:spec": {"f:taints": {}}}
LABELS = {"f:metadata": {"f:labels": {"f:x": {}}}}


@pytest.mark.parametrize(
    ("fields", "by"),
    [
        (None, ""),
        ([], ""),
        ([entry("kubelet", LABELS), entry("kubectl-taint", TAINTS)], "kubectl-taint"),
        ([entry("gpuhealth-controller", {**LABELS, **TAINTS})], "gpuhealth-controller"),
        ([entry("kubelet", LABELS)], ""),  # an emptied list has no owner: unknown
        ([entry("kubelet", TAINTS, subresource="status")], ""),
        (["junk", {"fieldsV1": "junk"}], ""),
    ],
)
def test_who_owns_the_taints(fields: object, by: str) -> None:
    assert taints_manager(fields) == by
    assert node_view({"metadata": {"name": "n", "managedFields": fields}}).taints_by == by
