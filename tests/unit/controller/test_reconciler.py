"""The reconciler's pure trigger: which node watch changes make it look at a node again."""

from __future__ import annotations

import dataclasses

from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.policy import Keys, NodeCondition, Taint
from gpuhealth.controller.reconciler import relevant_change

K = Keys()
BAD = Taint(K.unhealthy, "xid-79", "NoSchedule")
UNHEALTHY_COND = NodeCondition("False", "XidError", "GPU 0")


def view(*taints: Taint, labels: dict[str, str] | None = None) -> NodeView:
    return NodeView(
        name="n1",
        resource_version="42",
        labels=labels or {},
        taints=tuple(t.to_api() for t in taints),
        condition=UNHEALTHY_COND,
        gpus=8,
    )


def test_relevant_change_ignores_heartbeats() -> None:
    a = view(BAD)
    b = dataclasses.replace(a, resource_version="43")
    assert not relevant_change(K, a, b)
    assert relevant_change(K, a, view())
    assert relevant_change(K, a, view(BAD, labels={K.exclude_label: "true"}))
    assert relevant_change(K, None, a)
