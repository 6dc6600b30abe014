"""Identity, not names: a validation pod is the episode's only when owner, labels and node
match; gpuhealth's own pods are recognised by their owner (pure)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuhealth.controller.remediation.facts import NodeFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import API_VERSION, KIND, Episode, initial_status
from gpuhealth.controller.remediation.pod_facts import foreign_validation_pod, validation_pod_facts
from tests.fakes.remediation_world import KEYS, T0, fault_condition, node_facts
from tests.support.remediation import settings

NODE: NodeFacts = node_facts(unhealthy={3: fault_condition("xid-48", "RESET_GPU")})


def episode() -> Episode:
    spec = expected_spec(
        "node-a", "boot-1", failed_gpus(NODE), detected_at=T0, history=(), settings=settings()
    )
    assert spec is not None
    return Episode(
        name=episode_name("node-a", spec.fault.fingerprint),
        uid="ep-uid",
        spec=spec,
        status=initial_status(T0),
    )


EP = episode()


def ours() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpuhealth-validate-x-1",
            "labels": {
                "app.kubernetes.io/managed-by": "gpuhealth-controller",
                KEYS.episode_label: EP.spec.fault.fingerprint,
            },
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": KIND, "name": EP.name, "uid": EP.uid}
            ],
        },
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Succeeded"},
    }


def changed(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(ours())
    at: Any = obj
    for key in path[:-1]:
        at = at[key]
    if value is None:
        at.pop(path[-1], None)
    else:
        at[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (ours(), ""),
        (changed(("metadata", "ownerReferences"), None), "not owned by"),
        (
            changed(
                ("metadata", "ownerReferences"),
                [{"apiVersion": API_VERSION, "kind": KIND, "name": EP.name, "uid": "other"}],
            ),
            "not owned by",
        ),
        (
            changed(
                ("metadata", "ownerReferences"),
                [{"apiVersion": "v1", "kind": "Pod", "name": EP.name, "uid": EP.uid}],
            ),
            "not owned by",
        ),
        (changed(("metadata", "labels", KEYS.episode_label), "0000"), KEYS.episode_label),
        (changed(("metadata", "labels", "app.kubernetes.io/managed-by"), "me"), "managed by"),
        (changed(("spec", "nodeName"), "node-b"), "bound to node node-b"),
        (changed(("spec", "nodeName"), None), "bound to node (none)"),
    ],
)
def test_ours_only_when_owner_labels_and_node_match(obj: dict[str, Any], why: str) -> None:
    found = foreign_validation_pod(obj, EP, KEYS)
    assert (found == "") if not why else (why in found)
    facts = validation_pod_facts(obj, EP, KEYS)
    assert facts.phase == "Succeeded" and bool(facts.foreign) is bool(why)


def pod_obj(namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "p",
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "gpuhealth"},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"nodeName": "node-a"}}


RS = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "gpuhealth-controller-5d8",
    "controller": True,
}


@pytest.mark.parametrize(
    ("obj", "own"),
    [
        (pod_obj("gpuhealth", RS), True),
        (pod_obj("gpuhealth", {**RS, "kind": "DaemonSet"}), True),
        (pod_obj("tenant", RS), False),  # the label and an owner of that name elsewhere
        (pod_obj("gpuhealth", None), False),  # a bare pod with the label
        (pod_obj("gpuhealth", {**RS, "controller": False}), False),
        (pod_obj("gpuhealth", {**RS, "kind": "Job", "apiVersion": "batch/v1"}), False),
    ],
)
def test_gpuhealths_own_pods_are_recognised_by_owner_not_label(
    obj: dict[str, Any], own: bool
) -> None:
    from gpuhealth.controller.remediation.pod_facts import pod_facts

    assert pod_facts(obj, own_namespace="gpuhealth").release_owned is own
    assert pod_facts(obj).release_owned is False  # no namespace known: nothing is ours
