"""A pod's job (pure), and that any pod JSON yields one without raising."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.incidents.jobs import JobRef, job_of

KINDS = ("jobset", "volcano", "kueue", "coscheduling", "leaderworkerset", "job")


def pod(labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None) -> Any:
    return {
        "metadata": {
            "namespace": "ml",
            "name": "p-0",
            "uid": "u1",
            "labels": labels or {},
            "ownerReferences": owners or [],
        }
    }


JOB_OWNER = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "name": "train",
    "uid": "j1",
    "controller": True,
}


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (pod(owners=[JOB_OWNER]), JobRef("ml", "Job", "train", "j1")),
        (
            pod({"jobset.sigs.k8s.io/jobset-name": "big"}, [JOB_OWNER]),
            JobRef("ml", "JobSet", "big"),
        ),
        (pod({"scheduling.x-k8s.io/pod-group": "g"}), JobRef("ml", "gang-coscheduling", "g")),
        (
            pod({"batch.kubernetes.io/job-name": "t", "batch.kubernetes.io/controller-uid": "u"}),
            JobRef("ml", "Job", "t", "u"),
        ),
        (pod(), JobRef("ml", "Pod", "p-0", "u1")),
    ],
)
def test_job_of(obj: Any, want: JobRef) -> None:
    assert job_of(obj, KINDS) == want


def test_involved_object_names_the_owner() -> None:
    ref = job_of(pod(owners=[JOB_OWNER]), KINDS)
    assert ref.key == "ml/Job/train"
    assert ref.involved() == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": "ml",
        "name": "train",
        "uid": "j1",
    }


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.sampled_from(["metadata", "spec", "status"]),
        st.dictionaries(
            st.sampled_from(["name", "namespace", "labels", "ownerReferences", "uid"]), JSON
        )
        | JSON,
    )
)
def test_any_pod_json_yields_a_job(obj: dict[str, Any]) -> None:
    assert isinstance(job_of(obj, KINDS), JobRef)
