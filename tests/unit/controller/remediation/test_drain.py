"""Drain planning, table-driven (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpuhealth.controller.remediation.drain import (
    DrainPlan,
    exempt_reason,
    gangs_in_scope,
    plan_drain,
    selects,
)
from gpuhealth.controller.remediation.facts import (
    NodeFacts,
    PdbFacts,
    PodFacts,
    SelectorRequirement,
)
from gpuhealth.controller.remediation.fault import expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import FrozenGang, PodRecord, Spec
from gpuhealth.controller.remediation.settings import DrainRule, DrainSettings, GangSettings
from gpuhealth.protocol import Allocation
from tests.fakes.remediation_world import T0, fault_condition, gpu_uuid, node_facts, pod
from tests.support.remediation import settings

KINDS = GangSettings().kinds


def alloc(name: str, gpu: int, namespace: str = "work") -> Allocation:
    return Allocation(
        namespace=namespace,
        pod=name,
        container="c",
        gpu_uuid=gpu_uuid(gpu),
        device_id=gpu_uuid(gpu),
    )


def spec_for(node: NodeFacts, scope: str = "gpu") -> Spec:
    s = expected_spec(
        "node-a", "boot-1", failed_gpus(node), detected_at=T0, history=(), settings=settings()
    )
    assert s is not None
    return replace_scope(s, scope)


def replace_scope(s: Spec, scope: str) -> Spec:
    import msgspec

    return msgspec.structs.replace(s, scope=scope)  # type: ignore[arg-type]


def plan(
    node: NodeFacts,
    pods: list[PodFacts],
    *,
    scope: str = "gpu",
    elsewhere: list[PodFacts] | None = None,
    pdbs: list[PdbFacts] | None = None,
    waiting: list[PodRecord] | None = None,
    drain: DrainSettings | None = None,
    now_s: float = 0.0,
) -> DrainPlan:
    return plan_drain(
        spec_for(node, scope),
        node,
        pods=pods,
        gang_pods=elsewhere or [],
        pdbs=pdbs or [],
        previous_waiting=waiting or [],
        settings=drain or DrainSettings(),
        started=T0,
        now=T0 + timedelta(seconds=now_s),
    )


def evicted(p: DrainPlan) -> list[str]:
    return sorted(e.pod.name for e in p.evict)


NODE = node_facts(
    unhealthy={3: fault_condition("xid-48", "RESET_GPU")},
    allocations=(alloc("a", 3), alloc("b", 1)),
)


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod("ds", owners=(("DaemonSet", "x"),)), "daemonset"),
        (pod("mirror", annotations={"kubernetes.io/config.mirror": "h"}), "static"),
        (pod("static", owners=(("Node", "node-a"),)), "static"),
        (
            replace(
                pod("self", labels={"app.kubernetes.io/name": "gpuhealth"}), release_owned=True
            ),
            "protected",
        ),
        (pod("tenant", labels={"app.kubernetes.io/name": "gpuhealth"}), None),
        (replace(pod("other", owners=(("ReplicaSet", "x"),)), release_owned=True), None),
        (pod("done", phase="Succeeded"), "finished"),
        (pod("failed", phase="Failed"), "finished"),
        (pod("rs", owners=(("ReplicaSet", "x"),)), None),
    ],
)
def test_exemptions(p: PodFacts, reason: str | None) -> None:
    assert exempt_reason(p, DrainSettings()) == reason


def test_partial_drain_only_the_pods_on_the_failed_gpu() -> None:
    assert evicted(plan(NODE, [pod("a"), pod("b"), pod("c", gpus=0)])) == ["a"]


def test_partial_drain_without_attribution_takes_every_gpu_pod() -> None:
    unattributed = replace(NODE, allocations=None)
    assert evicted(plan(unattributed, [pod("a"), pod("b"), pod("c", gpus=0)])) == ["a", "b"]
    # GPU pods but no allocation at all: PodResources is not working, same fallback
    empty = replace(NODE, allocations=())
    assert evicted(plan(empty, [pod("a"), pod("b"), pod("c", gpus=0)])) == ["a", "b"]
    assert plan(empty, [pod("c", gpus=0)]).done


def test_node_scope_takes_every_pod_but_the_exempt() -> None:
    pods = [pod("a"), pod("c", gpus=0), pod("ds", owners=(("DaemonSet", "d"),))]
    assert evicted(plan(NODE, pods, scope="node")) == ["a", "c"]


def test_done_when_nothing_in_scope_is_left() -> None:
    assert plan(NODE, [pod("b"), pod("c", gpus=0)]).done


def jobset(name: str, node: str, js: str = "train") -> PodFacts:
    return pod(
        name,
        node,
        labels={"jobset.sigs.k8s.io/jobset-name": js, "batch.kubernetes.io/job-name": f"{js}-w-0"},
    )


def test_gang_is_evicted_whole_across_nodes() -> None:
    local = jobset("a", "node-a")
    remote = [jobset("w1", "node-b"), jobset("w2", "node-c"), jobset("x", "node-d", js="other")]
    p = plan(NODE, [local, pod("b")], elsewhere=remote)
    assert evicted(p) == ["a", "w1", "w2"]
    assert {e.gang for e in p.evict} == {"jobset:jobset.sigs.k8s.io/jobset-name=train"}


def test_gang_is_held_whole_while_a_pdb_would_split_it() -> None:
    local = jobset("a", "node-a")
    remote = [jobset("w1", "node-b")]
    pdb = PdbFacts(
        namespace="work",
        name="train",
        match_labels={"jobset.sigs.k8s.io/jobset-name": "train"},
        disruptions_allowed=1,
    )
    p = plan(NODE, [local], elsewhere=remote, pdbs=[pdb])
    assert p.evict == ()
    assert {w.reason for w in p.waiting} == {"gang-pdb-blocked"}
    ok = replace(pdb, disruptions_allowed=2)
    assert evicted(plan(NODE, [local], elsewhere=remote, pdbs=[ok])) == ["a", "w1"]
    stale = replace(pdb, disruptions_allowed=5, up_to_date=False)
    assert plan(NODE, [local], elsewhere=remote, pdbs=[stale]).evict == ()


def test_gang_larger_than_the_limit_is_not_evicted() -> None:
    drain = DrainSettings(gang=GangSettings(max_pods=2))
    remote = [jobset(f"w{i}", "node-b") for i in range(3)]
    p = plan(NODE, [jobset("a", "node-a")], elsewhere=remote, drain=drain)
    assert p.evict == () and {w.reason for w in p.waiting} == {"gang-too-large"}


def test_gangs_off_evicts_only_the_local_pod() -> None:
    drain = DrainSettings(gang=GangSettings(enabled=False))
    p = plan(NODE, [jobset("a", "node-a")], elsewhere=[jobset("w1", "node-b")], drain=drain)
    assert evicted(p) == ["a"]
    assert gangs_in_scope(spec_for(NODE), NODE, [jobset("a", "node-a")], drain) == []


@pytest.mark.parametrize(
    ("rule", "now_s", "want_evict", "want_reason"),
    [
        (DrainRule(namespaces=("work",), mode="evict"), 0, ["a"], None),
        (DrainRule(namespaces=("wo*",), mode="wait", wait_s=600), 10, [], "let-finish"),
        (DrainRule(namespaces=("work",), mode="wait", wait_s=600), 601, ["a"], None),
        (DrainRule(namespaces=("work",), mode="never"), 10_000, [], "never"),
        (DrainRule(namespaces=("other",), mode="never"), 0, ["a"], None),
    ],
)
def test_namespace_modes(
    rule: DrainRule, now_s: float, want_evict: list[str], want_reason: str | None
) -> None:
    p = plan(NODE, [pod("a")], drain=DrainSettings(rules=(rule,)), now_s=now_s)
    assert evicted(p) == want_evict
    assert [w.reason for w in p.waiting] == ([want_reason] if want_reason else [])


def test_grace_period_follows_the_rule() -> None:
    p = plan(
        NODE,
        [pod("a")],
        drain=DrainSettings(
            grace_period_s=5, rules=(DrainRule(namespaces=("work",), grace_period_s=60),)
        ),
    )
    assert p.evict[0].grace_period_s == 60
    assert (
        plan(NODE, [pod("a")], drain=DrainSettings(grace_period_s=5)).evict[0].grace_period_s == 5
    )


def test_stuck_terminating_pods_are_force_candidates_only_where_allowed() -> None:
    stuck = replace(pod("a"), deletion_timestamp=T0)
    rule = DrainRule(namespaces=("work",), force=True)
    p = plan(NODE, [stuck], drain=DrainSettings(rules=(rule,)), now_s=1000)
    assert [f.name for f in p.force] == ["a"] and p.waiting[0].message == "stuck"
    assert plan(NODE, [stuck], now_s=1000).force == ()
    assert plan(NODE, [stuck], drain=DrainSettings(rules=(rule,)), now_s=10).force == ()


def test_waiting_pods_elsewhere_are_followed_to_the_end() -> None:
    remote = jobset("w1", "node-b")
    rec = PodRecord(
        namespace="work", name="w1", uid=remote.uid, node="node-b", gang="g", reason="pdb-blocked"
    )
    p = plan(NODE, [pod("b")], elsewhere=[remote], waiting=[rec])
    assert evicted(p) == ["w1"] and not p.done


def req(key: str, op: str, *values: str) -> SelectorRequirement:
    return SelectorRequirement(key, op, values)


@pytest.mark.parametrize(
    ("pdb", "labels", "want"),
    [
        (PdbFacts("work", "p", match_labels={"app": "x"}), {"app": "x"}, True),
        (PdbFacts("work", "p", match_labels={"app": "x"}), {"app": "y"}, False),
        (
            PdbFacts("work", "p", match_expressions=(req("tier", "In", "a", "b"),)),
            {"tier": "b"},
            True,
        ),
        (PdbFacts("work", "p", match_expressions=(req("tier", "NotIn", "a"),)), {}, True),
        (PdbFacts("work", "p", match_expressions=(req("tier", "Exists"),)), {}, False),
        (PdbFacts("work", "p", match_expressions=(req("tier", "DoesNotExist"),)), {}, True),
        (PdbFacts("work", "p", match_expressions=(req("tier", "Bogus"),)), {"tier": "a"}, False),
        (PdbFacts("work", "p", selects_all=True), {}, True),
        (PdbFacts("work", "p"), {"app": "x"}, False),
        (PdbFacts("other", "p", selects_all=True), {}, False),
    ],
)
def test_pdb_selector(pdb: PdbFacts, labels: dict[str, str], want: bool) -> None:
    assert selects(pdb, pod("a", labels=labels)) is want


# -- blast radius: frozen gangs, replacements, caps ------------------------------------------


def plan_with(
    pods: list[PodFacts],
    elsewhere: list[PodFacts],
    *,
    frozen: tuple[FrozenGang, ...] = (),
    touched: tuple[str, ...] = (),
    evicted_count: int = 0,
    drain: DrainSettings | None = None,
) -> DrainPlan:
    return plan_drain(
        spec_for(NODE),
        NODE,
        pods=pods,
        gang_pods=elsewhere,
        pdbs=[],
        previous_waiting=[],
        settings=drain or DrainSettings(),
        started=T0,
        now=T0 + timedelta(seconds=30),
        frozen=frozen,
        touched=touched,
        evicted_count=evicted_count,
    )


def born(p: PodFacts, after_s: float) -> PodFacts:
    return replace(p, created=T0 + timedelta(seconds=after_s))


def test_the_first_eviction_freezes_the_gang_by_uid() -> None:
    local = born(jobset("a", "node-a"), -600)
    remote = [born(jobset("w1", "node-b"), -600), born(jobset("w2", "node-c"), -600)]
    p = plan_with([local], remote)
    assert evicted(p) == ["a", "w1", "w2"]
    (frozen,) = p.freeze
    assert frozen.kind == "jobset" and frozen.uids == sorted(x.uid for x in [local, *remote])
    # the next round: the gang is frozen, nothing new is frozen again
    again = plan_with([local], remote, frozen=p.freeze)
    assert evicted(again) == ["a", "w1", "w2"] and again.freeze == ()


def test_replacement_pods_of_a_frozen_gang_are_never_evicted() -> None:
    # the faulty node's member terminates slowly (a finalizer); the JobSet controller
    # recreated the other members under the same labels with new UIDs
    local = replace(jobset("a", "node-a"), deletion_timestamp=T0)
    first = plan_with([jobset("a", "node-a")], [jobset("w1", "node-b")])
    replacements = [
        replace(jobset("w1", "node-b"), uid="uid-new-w1"),
        replace(jobset("w2", "node-c"), uid="uid-new-w2"),
    ]
    p = plan_with([local], replacements, frozen=first.freeze)
    assert p.evict == () and [w.reason for w in p.waiting] == ["terminating"]


def test_pods_created_after_the_drain_began_are_not_gang_members() -> None:
    local = born(jobset("a", "node-a"), -600)
    old, new = born(jobset("w1", "node-b"), -600), born(jobset("w2", "node-c"), 10)
    p = plan_with([local], [old, new])
    assert evicted(p) == ["a", "w1"]
    assert p.freeze[0].uids == sorted([local.uid, old.uid])


@pytest.mark.parametrize(
    ("drain", "touched", "evicted_count", "cap"),
    [
        (DrainSettings(max_pods=2), (), 0, "drain.max_pods (2)"),
        (DrainSettings(max_pods=4), (), 2, "drain.max_pods (4)"),
        (DrainSettings(max_other_nodes=1), (), 0, "drain.max_other_nodes (1)"),
        (DrainSettings(max_other_nodes=2), ("node-x",), 0, "drain.max_other_nodes (2)"),
        (DrainSettings(gang=GangSettings(max_pods=2)), (), 0, "drain.gang.max_pods"),
    ],
)
def test_a_drain_over_a_cap_evicts_nothing(
    drain: DrainSettings, touched: tuple[str, ...], evicted_count: int, cap: str
) -> None:
    pods = [jobset("a", "node-a"), pod("b"), pod("solo", gpus=1)]
    remote = [jobset("w1", "node-b"), jobset("w2", "node-c")]
    p = plan_with([pods[0]], remote, touched=touched, evicted_count=evicted_count, drain=drain)
    assert p.evict == () and p.force == () and p.freeze == ()
    assert cap in p.over_cap and not p.done
    assert {w.reason for w in p.waiting} <= {"over-cap", "gang-too-large"}


def test_the_default_caps_hold_a_gang_spanning_ten_other_nodes() -> None:
    remote = [jobset(f"w{i}", f"node-{i}") for i in range(10)]
    p = plan_with([jobset("a", "node-a")], remote)
    assert p.evict == () and "drain.max_other_nodes (4)" in p.over_cap
    within = plan_with([jobset("a", "node-a")], remote[:4])
    assert len(within.evict) == 5 and within.over_cap == ""


def test_members_already_terminating_are_not_frozen() -> None:
    gone = replace(jobset("w1", "node-b"), deletion_timestamp=T0)
    p = plan_with([jobset("a", "node-a")], [gone, jobset("w2", "node-c")])
    assert evicted(p) == ["a", "w2"]
    assert p.freeze[0].uids == sorted([jobset("a", "node-a").uid, jobset("w2", "node-c").uid])


def test_a_gang_member_on_a_node_kept_off_the_loop_holds_the_drain() -> None:
    remote = [jobset("w1", "node-b"), jobset("w2", "node-c")]
    p = plan_drain(
        spec_for(NODE),
        NODE,
        pods=[jobset("a", "node-a")],
        gang_pods=remote,
        pdbs=[],
        previous_waiting=[],
        settings=DrainSettings(),
        started=T0,
        now=T0,
        off_limits={"node-c": "gpuhealth.io/remediation=disabled"},
    )
    assert p.evict == () and "node node-c, which is labelled gpuhealth.io/remediation" in p.over_cap
