"""Identity, not names: a validation pod is the episode's only by the UID its create call
returned; gpuhealth's own pods are recognised by their owner (pure)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from gpuhealth.controller.remediation.actions import CreateValidationPod
from gpuhealth.controller.remediation.facts import NodeFacts, ValidationPodFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import (
    API_VERSION,
    KIND,
    Episode,
    ValidationStatus,
    initial_status,
)
from gpuhealth.controller.remediation.outcomes import record_validation_pod
from gpuhealth.controller.remediation.pod_facts import validation_pod_facts
from gpuhealth.controller.remediation.validating import pod_name, validation_pod_step
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


def ours(uid: str = "pod-uid-1") -> dict[str, Any]:
    """The pod the loop creates (owner, labels, node: all of it something anyone who may
    create pods in the namespace can copy, except the UID the API server gives it)."""
    return {
        "metadata": {
            "name": "gpuhealth-validate-x-1",
            "uid": uid,
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


FIRST = pod_name(EP, 1)


def seen(uid: str, phase: str = "Succeeded", name: str = FIRST) -> ValidationPodFacts:
    obj = copy.deepcopy(ours(uid))
    obj["metadata"]["name"] = name
    obj["status"]["phase"] = phase
    return validation_pod_facts(obj)


def vs(**kw: Any) -> ValidationStatus:
    return ValidationStatus(attempt=1, started_at=T0, **kw)


@pytest.mark.parametrize(
    ("name", "v", "pod", "want_name", "want_tries", "create", "passed", "problem"),
    [
        ("first pass: named and created", vs(), None, FIRST, 0, True, False, None),
        (
            "ours (the recorded UID) succeeded: passed",
            vs(pod_name=FIRST, pod_uid="u1"),
            seen("u1"),
            FIRST, 0, False, True, None,
        ),
        (
            "ours failed: the validation fails",
            vs(pod_name=FIRST, pod_uid="u1"),
            seen("u1", "Failed"),
            FIRST, 0, False, False, "ValidationFailed",
        ),
        (
            "ours still running: waits",
            vs(pod_name=FIRST, pod_uid="u1"),
            seen("u1", "Running"),
            FIRST, 0, False, False, None,
        ),
        (
            "a perfect lookalike of another UID (ours deleted, the name taken): not ours",
            vs(pod_name=FIRST, pod_uid="u1"),
            seen("forged"),
            FIRST, 0, False, False, "ValidationPodNotOurs",
        ),
        (
            "the name was taken before the create (409, no UID): never accepted, a new name",
            vs(pod_name=FIRST),
            seen("forged"),
            pod_name(EP, 1, 1), 1, True, False, None,
        ),
        (
            "created, not seen yet and no UID recorded: created again under the same name",
            vs(pod_name=FIRST),
            None,
            FIRST, 0, True, False, None,
        ),
        (
            "ours vanished: a new one under a new name",
            vs(pod_name=FIRST, pod_uid="u1"),
            None,
            pod_name(EP, 1, 1), 1, True, False, None,
        ),
        (
            "the last name taken too: not ours, escalated",
            vs(pod_name=pod_name(EP, 1, 2), pod_tries=2),
            seen("forged", name=pod_name(EP, 1, 2)),
            pod_name(EP, 1, 2), 2, False, False, "ValidationPodNotOurs",
        ),
    ],
)  # fmt: skip
def test_the_validation_pod_is_ours_only_by_the_uid_its_create_returned(
    name: str,
    v: ValidationStatus,
    pod: ValidationPodFacts | None,
    want_name: str,
    want_tries: int,
    create: bool,
    passed: bool,
    problem: str | None,
) -> None:
    """Owner, labels and node prove nothing (anyone who may create pods in the validation
    namespace can copy them, the name is predictable): before, a lookalike created first
    passed the validation."""
    after, acts, trouble = validation_pod_step(EP, v, pod)
    assert after.pod_name == want_name and after.pod_tries == want_tries
    assert [type(a) for a in acts] == ([CreateValidationPod] if create else [])
    if create:
        assert acts[0] == CreateValidationPod(want_name, "node-a")
    assert after.pod_passed is passed
    assert (trouble[0] if trouble else None) == problem


def test_the_uid_the_create_returned_is_recorded_for_the_pod_it_named() -> None:
    st = initial_status(T0)
    st = msgspec.structs.replace(st, validation=vs(pod_name=FIRST))
    assert record_validation_pod(st, FIRST, "u1").validation == vs(pod_name=FIRST, pod_uid="u1")
    assert record_validation_pod(st, FIRST, None) == st  # the name was taken: nothing
    assert record_validation_pod(st, "other", "u1") == st


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
