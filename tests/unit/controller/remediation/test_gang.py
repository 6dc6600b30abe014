"""Gang rules: which pods belong together (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.remediation.gang import gang_of, members
from gpuhealth.controller.remediation.settings import GangSettings
from tests.fakes.remediation_world import pod

KINDS = (*GangSettings().kinds, "job")
"""Every rule: plain Jobs are grouped only when ``job`` is added (opt-in)."""

GANG_CASES: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    (
        "jobset wins over job",
        {"labels": {"jobset.sigs.k8s.io/jobset-name": "js", "batch.kubernetes.io/job-name": "j"}},
        "jobset",
        "jobset.sigs.k8s.io/jobset-name=js",
    ),
    (
        "volcano podgroup annotation",
        {"annotations": {"scheduling.k8s.io/group-name": "pg"}},
        "volcano",
        None,
    ),
    (
        "volcano job label",
        {"labels": {"volcano.sh/job-name": "vj"}},
        "volcano",
        "volcano.sh/job-name=vj",
    ),
    (
        "kueue pod group",
        {"labels": {"kueue.x-k8s.io/pod-group-name": "g"}},
        "kueue",
        "kueue.x-k8s.io/pod-group-name=g",
    ),
    ("kueue workload", {"annotations": {"kueue.x-k8s.io/workload": "wl"}}, "kueue", None),
    (
        "coscheduling",
        {"labels": {"scheduling.x-k8s.io/pod-group": "pg"}},
        "coscheduling",
        "scheduling.x-k8s.io/pod-group=pg",
    ),
    (
        "lws group key",
        {
            "labels": {
                "leaderworkerset.sigs.k8s.io/group-key": "abc",
                "leaderworkerset.sigs.k8s.io/name": "l",
            }
        },
        "leaderworkerset",
        "leaderworkerset.sigs.k8s.io/group-key=abc",
    ),
    (
        "lws name and index",
        {
            "labels": {
                "leaderworkerset.sigs.k8s.io/name": "l",
                "leaderworkerset.sigs.k8s.io/group-index": "2",
            }
        },
        "leaderworkerset",
        "leaderworkerset.sigs.k8s.io/name=l,leaderworkerset.sigs.k8s.io/group-index=2",
    ),
    (
        "job by uid",
        {
            "labels": {
                "batch.kubernetes.io/controller-uid": "u",
                "batch.kubernetes.io/job-name": "j",
            }
        },
        "job",
        "batch.kubernetes.io/controller-uid=u",
    ),
    ("legacy job", {"labels": {"job-name": "j"}}, "job", "job-name=j"),
    ("a plain pod", {"labels": {"app": "web"}}, None, None),
]


@pytest.mark.parametrize(
    ("name", "meta", "kind", "selector"), GANG_CASES, ids=[c[0] for c in GANG_CASES]
)
def test_gang_rules(
    name: str, meta: dict[str, Any], kind: str | None, selector: str | None
) -> None:
    g = gang_of(pod("p", **meta), KINDS)
    assert (g.kind if g else None) == kind
    if g is not None:
        assert g.label_selector() == selector


def test_gang_members_match_namespace_and_every_key() -> None:
    lws = {"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/group-index": "0"}
    g = gang_of(pod("p", labels=lws), KINDS)
    assert g is not None
    other_group = pod("q", labels={**lws, "leaderworkerset.sigs.k8s.io/group-index": "1"})
    other_ns = pod("r", namespace="elsewhere", labels=lws)
    same = pod("s", "node-z", labels=lws)
    assert [p.name for p in members(g, [other_group, other_ns, same, same])] == ["s"]


def test_plain_jobs_are_not_gangs_by_default() -> None:
    job = pod("p", labels={"batch.kubernetes.io/controller-uid": "u", "job-name": "j"})
    assert "job" not in GangSettings().kinds
    assert gang_of(job, GangSettings().kinds) is None
