"""What ``gpuhealth-controller cleanup`` removes from a Node or Pod: everything under the
prefix the controller wrote, never a foreign taint, label or annotation, never the operator's
own inputs (exclude, remediation opt-out)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.cleanup.plan import (
    condition_delete_body,
    is_validation_pod,
    plan_node_cleanup,
    pod_annotation_patch,
)
from gpuhealth.controller.kube.node_view import node_view
from gpuhealth.controller.names import Keys

K = Keys()
SHARD_LABEL = "node-restriction.kubernetes.io/gpuhealth.io-shard"
OURS_NS = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
OURS_NE = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoExecute"}
QUARANTINE = {"key": "gpuhealth.io/remediation", "value": "reset-gpu", "effect": "NoSchedule"}
FOREIGN = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
FOREIGN_NE = {"key": "example.com/x", "value": "y", "effect": "NoExecute", "timeAdded": "t"}
LOOKALIKE = {"key": "gpuhealth.io.example.com/x", "value": "y", "effect": "NoSchedule"}
GPU_CONDITION = {"type": "GPUHealthy", "status": "False", "reason": "XidError", "message": "m"}


def node(
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-1",
            "resourceVersion": "42",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or []},
        "status": {"conditions": conditions or [{"type": "Ready", "status": "True"}]},
    }


@pytest.mark.parametrize(
    ("obj", "keep_taints", "want_taints", "want_labels", "want_annotations", "want_condition"),
    [
        pytest.param(node(), False, None, (), (), False, id="nothing-of-ours"),
        pytest.param(
            node([FOREIGN, OURS_NS, FOREIGN_NE, OURS_NE]),
            False,
            [FOREIGN, FOREIGN_NE],
            (),
            (),
            False,
            id="our-taints-go-foreign-stay-in-order",
        ),
        pytest.param(
            node([QUARANTINE, LOOKALIKE]), False, [LOOKALIKE], (), (), False, id="quarantine-too"
        ),
        pytest.param(
            node(
                labels={
                    "gpuhealth.io/state": "unhealthy",
                    "gpuhealth.io/healthy-gpus": "7",
                    "gpuhealth.io/rma": "contact-support",
                    "gpuhealth.io/exclude": "true",
                    "gpuhealth.io/remediation": "disabled",
                    "node-restriction.kubernetes.io/gpuhealth.io-exclude": "true",
                    "node-restriction.kubernetes.io/gpuhealth.io-remediation": "disabled",
                    SHARD_LABEL: "3",
                    "kubernetes.io/hostname": "gpu-1",
                    "team": "ml",
                }
            ),
            False,
            None,
            ("gpuhealth.io/healthy-gpus", "gpuhealth.io/rma", "gpuhealth.io/state", SHARD_LABEL),
            (),
            False,
            id="our-labels-go-operator-inputs-stay",
        ),
        pytest.param(
            node(
                [OURS_NS],
                annotations={
                    "gpuhealth.io/applied-taints": "gpuhealth.io/unhealthy=xid-79:NoSchedule",
                    "gpuhealth.io/acknowledged-taints": "x=y:NoSchedule",
                    "node.alpha.kubernetes.io/ttl": "0",
                },
                conditions=[{"type": "Ready", "status": "True"}, GPU_CONDITION],
            ),
            False,
            [],
            (),
            ("gpuhealth.io/acknowledged-taints", "gpuhealth.io/applied-taints"),
            True,
            id="annotations-and-condition",
        ),
        pytest.param(
            node(
                [FOREIGN, OURS_NS],
                labels={"gpuhealth.io/state": "unhealthy", SHARD_LABEL: "0"},
                annotations={
                    "gpuhealth.io/applied-taints": "gpuhealth.io/unhealthy=xid-79:NoSchedule",
                    "gpuhealth.io/other": "1",
                },
                conditions=[GPU_CONDITION],
            ),
            True,
            None,
            ("gpuhealth.io/state", SHARD_LABEL),
            ("gpuhealth.io/applied-taints", "gpuhealth.io/other"),
            True,
            id="keep-taints-keeps-no-bookkeeping",
        ),
    ],
)
def test_plan_node_cleanup(
    obj: dict[str, Any],
    keep_taints: bool,
    want_taints: list[dict[str, Any]] | None,
    want_labels: tuple[str, ...],
    want_annotations: tuple[str, ...],
    want_condition: bool,
) -> None:
    plan = plan_node_cleanup(node_view(obj), K, keep_taints=keep_taints)
    assert plan.taints == want_taints
    assert plan.labels == want_labels
    assert plan.annotations == want_annotations
    assert plan.condition is want_condition
    assert plan.empty is (
        want_taints is None and not want_labels and not want_annotations and not want_condition
    )


def test_patch_body_is_guarded_and_removes_by_null() -> None:
    obj = node(
        [FOREIGN, OURS_NS],
        labels={"gpuhealth.io/state": "unhealthy"},
        annotations={"gpuhealth.io/applied-taints": "a=b:NoSchedule"},
    )
    plan = plan_node_cleanup(node_view(obj), K)
    assert plan.removed_taints == ("gpuhealth.io/unhealthy=xid-79:NoSchedule",)
    assert plan.patch_body() == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {"gpuhealth.io/state": None},
            "annotations": {"gpuhealth.io/applied-taints": None},
        },
        "spec": {"taints": [FOREIGN]},
    }
    only_labels = plan_node_cleanup(node_view(node(labels={"gpuhealth.io/state": "x"})), K)
    assert "spec" not in only_labels.patch_body()  # the taint list is not rewritten needlessly


def test_condition_delete_names_only_ours() -> None:
    assert condition_delete_body() == {
        "status": {"conditions": [{"type": "GPUHealthy", "$patch": "delete"}]}
    }


def test_another_prefix_owns_other_names() -> None:
    keys = Keys("gpu.example.com")
    obj = node(
        [OURS_NS, {"key": "gpu.example.com/unhealthy", "value": "x", "effect": "NoSchedule"}],
        labels={"gpuhealth.io/state": "x", "gpu.example.com/exclude": "true"},
    )
    plan = plan_node_cleanup(node_view(obj), keys)
    assert plan.taints == [OURS_NS]
    assert plan.labels == ()
    assert "gpu.example.com/exclude" in keys.operator_labels()


def test_pod_annotation_patch() -> None:
    key = "gpuhealth.io/idle-since"
    assert pod_annotation_patch({"metadata": {"annotations": {"a": "b"}}}, key) is None
    assert pod_annotation_patch({"metadata": {}}, key) is None
    assert pod_annotation_patch({"metadata": {"annotations": {key: "t", "a": "b"}}}, key) == {
        "metadata": {"annotations": {key: None}}
    }


_key = st.sampled_from(
    ["gpuhealth.io/unhealthy", "gpuhealth.io/degraded", "gpuhealth.io/remediation",
     "gpuhealth.io/state", "gpuhealth.io/exclude", "gpuhealth.iox/a", "example.com/a", "team",
     SHARD_LABEL, "node-restriction.kubernetes.io/gpuhealth.io-exclude"]
)  # fmt: skip
_taint = st.fixed_dictionaries(
    {"key": _key, "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])},
    optional={"value": st.text(max_size=5)},
)


@given(
    taints=st.lists(_taint, max_size=6),
    labels=st.dictionaries(_key, st.text(max_size=3), max_size=6),
    annotations=st.dictionaries(_key, st.text(max_size=3), max_size=6),
    keep_taints=st.booleans(),
)
def test_after_cleanup_nothing_of_ours_is_left_and_nothing_else_is_touched(
    taints: list[dict[str, Any]],
    labels: dict[str, str],
    annotations: dict[str, str],
    keep_taints: bool,
) -> None:
    obj = node(taints, labels, annotations, [GPU_CONDITION])
    plan = plan_node_cleanup(node_view(obj), K, keep_taints=keep_taints)
    after_taints = taints if plan.taints is None else plan.taints
    after_labels = {k: v for k, v in labels.items() if k not in plan.labels}
    after_annotations = {k: v for k, v in annotations.items() if k not in plan.annotations}
    foreign = [t for t in taints if not K.owns(t["key"])]
    assert [t for t in after_taints if not K.owns(t["key"])] == foreign
    if not keep_taints:
        assert after_taints == foreign
    assert {k for k in after_labels if K.owns(k)} <= K.operator_labels()
    assert SHARD_LABEL not in after_labels

    def foreign_labels(labels: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in labels.items() if not K.owns(k) and k != SHARD_LABEL}

    assert foreign_labels(after_labels) == foreign_labels(labels)
    assert not {k for k in after_annotations if K.owns(k)}
    assert {k for k in annotations if not K.owns(k)} <= set(after_annotations)
    assert plan.condition


EPISODE = "gpuhealth.io/remediation-episode"
MANAGED = {"app.kubernetes.io/managed-by": "gpuhealth-controller"}
OWNER = {"apiVersion": "gpuhealth.io/v1alpha1", "kind": "GPURemediation", "name": "e", "uid": "u"}


def vpod(labels: dict[str, str], owners: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": "v", "labels": labels, "ownerReferences": owners}}


@pytest.mark.parametrize(
    ("pod", "ours"),
    [
        (vpod({EPISODE: "f1", **MANAGED}, [OWNER]), True),
        # The loop's pod under another prefix: the episode label follows the prefix.
        (vpod({"example.com/remediation-episode": "f1", **MANAGED}, [OWNER]), False),
        (vpod({EPISODE: "f1"}, [OWNER]), False),  # not managed by the controller
        (vpod({EPISODE: "f1", "app.kubernetes.io/managed-by": "helm"}, [OWNER]), False),
        (vpod({EPISODE: "f1", **MANAGED}, []), False),  # no owner: someone copied the labels
        (vpod({EPISODE: "f1", **MANAGED}, [{**OWNER, "kind": "Job"}]), False),
        (vpod({EPISODE: "f1", **MANAGED}, [{**OWNER, "apiVersion": "example.com/v1"}]), False),
        (
            vpod({EPISODE: "f1", **MANAGED}, [{"apiVersion": "batch/v1", "kind": "Job"}, OWNER]),
            True,
        ),
        (vpod(MANAGED, [OWNER]), False),  # no episode label
        ({"metadata": {}}, False),
        ({}, False),
    ],
)
def test_only_the_loops_validation_pods_are_ours(pod: dict[str, Any], ours: bool) -> None:
    assert is_validation_pod(pod, K) is ours


@pytest.mark.parametrize(
    ("annotations", "unschedulable", "keep", "removed", "uncordon"),
    [
        # what gpuhealth set (listed in <prefix>/guards, still "true") goes with it
        (
            {
                "karpenter.sh/do-not-disrupt": "true",
                "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                K.guards_annotation: "karpenter.sh/do-not-disrupt,spec.unschedulable",
            },
            True,
            False,
            ("gpuhealth.io/guards", "karpenter.sh/do-not-disrupt"),
            True,
        ),
        # someone else's (not listed, or changed since) stays; their cordon stays
        (
            {
                "karpenter.sh/do-not-disrupt": "false",
                "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                K.guards_annotation: "karpenter.sh/do-not-disrupt",
            },
            True,
            False,
            ("gpuhealth.io/guards",),
            False,
        ),
        # keep_taints: a later install takes the guards over with the taints
        (
            {
                "karpenter.sh/do-not-disrupt": "true",
                K.guards_annotation: "karpenter.sh/do-not-disrupt,spec.unschedulable",
            },
            True,
            True,
            (),
            False,
        ),
    ],
)
def test_the_uninstall_lifts_only_the_guards_gpuhealth_set(
    annotations: dict[str, str],
    unschedulable: bool,
    keep: bool,
    removed: tuple[str, ...],
    uncordon: bool,
) -> None:
    obj = node(annotations=annotations)
    obj["spec"]["unschedulable"] = unschedulable
    plan = plan_node_cleanup(node_view(obj), K, keep_taints=keep)
    assert plan.annotations == removed
    assert plan.uncordon is uncordon
    body = plan.patch_body()
    assert body.get("spec", {}).get("unschedulable", "absent") == (False if uncordon else "absent")
