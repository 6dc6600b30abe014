"""Replace as an action (``remediation/replacing.py`` through the runner, over the in-memory
World): an escalated node of a pool that allows it is replaced (its Karpenter NodeClaim deleted,
or the Node cordoned, drained and deleted), written ahead, counted by the gate, recorded on the
episode that outlives the Node; bad input (no pool, a pool that does not allow it, no NodeClaim,
one that does not exist or is not the node's) gets an Event and a metric and deletes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.remediation.actions import ReplaceNode
from gpuhealth.controller.remediation.facts import Observed
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.remediation.replacer import node_mismatch, nodeclaim_mismatch
from gpuhealth.controller.remediation.replacing import replacement_step
from gpuhealth.controller.remediation.safety import unresolved_escalations
from gpuhealth.controller.remediation.settings import (
    ManagedRepairSettings,
    ReplacePool,
    ReplaceSettings,
)
from gpuhealth.controller.remediation.step import Context
from gpuhealth.controller.remediation.taint import holds_quarantine
from tests.fakes.remediation_world import KEYS, World, fault_condition, node_facts, pod
from tests.support.remediation import drive, one_round, runner_for, settings
from tests.unit.controller.remediation.test_machine import NOW, episode

ROW_REMAP = fault_condition("row-remap-failure", "CONTACT_SUPPORT")
CLAIM = ("karpenter.sh/v1", "NodeClaim", "nc-1", "uid-nc-1")
POOL = "karpenter.sh/nodepool"


def world(
    pool: str | None = "gpu-a", owners: tuple[tuple[str, str, str, str], ...] = (CLAIM,)
) -> World:
    w = World()
    labels = {POOL: pool} if pool else {}
    w.nodes["node-a"] = node_facts(
        "node-a", unhealthy={2: ROW_REMAP}, allocations=None, labels=labels, owners=owners
    )
    w.nodeclaims["nc-1"] = ("uid-nc-1", "node-a", pool or "")
    return w


def replacing(*pools: ReplacePool, **more: object) -> ReplaceSettings:
    return ReplaceSettings(enabled=True, pools=pools, **more)  # type: ignore[arg-type]


def only(w: World) -> Episode:
    (ep,) = w.store.episodes()
    return ep


def samples(registry: CollectorRegistry, result: str, method: str) -> float:
    value = registry.get_sample_value(
        "gpuhealth_remediation_replacements_total", {"method": method, "result": result}
    )
    return value or 0.0


async def test_a_karpenter_node_is_replaced_and_the_record_outlives_it() -> None:
    w = world()
    registry = CollectorRegistry()
    r = runner_for(w, settings(replace=replacing(ReplacePool(pool="gpu-a"))), registry=registry)
    await drive(w, r, lambda: w.replaced != [])
    ep = only(w)
    assert ep.phase is Phase.ESCALATED and w.replaced == [("nodeclaim", "nc-1")]
    rep = ep.status.replacement
    assert rep is not None and rep.state == "Deleted" and rep.method == "nodeclaim"
    assert (rep.node_claim, rep.node_claim_uid, rep.node_uid) == ("nc-1", "uid-nc-1", "uid-node-a")
    assert rep.pool == "gpu-a" and rep.rma == "contact-support"
    # written ahead: the stored status said Requested when the delete was sent
    assert w.statuses_at_delete == ["Requested"]
    assert ("replace-node", "node-a") in {(g.kind, g.node) for g in w.gate_requests}
    assert (ep.name, "NodeReplacementRequested") in w.notes
    assert samples(registry, "requested", "nodeclaim") == 1
    # still escalated and holding until the node is gone
    assert holds_quarantine(ep) and unresolved_escalations(w.store.episodes(), KEYS) == 1
    # Karpenter drains and deletes the Node: the replacement is complete, the record stays
    del w.nodes["node-a"]
    await one_round(w, r)
    ep = only(w)
    assert ep.status.replacement is not None and ep.status.replacement.state == "Completed"
    assert ep.replaced and not holds_quarantine(ep)
    assert unresolved_escalations(w.store.episodes(), KEYS) == 0
    assert ep.spec.fault.gpus[0].code == "row-remap-failure"  # the evidence stays
    assert (ep.name, "NodeReplaced") in w.notes
    assert samples(registry, "completed", "nodeclaim") == 1
    # a new Node of the name (Karpenter reuses none; a cloud may) is another node: it starts
    # afresh, not blocked by the old escalation, and nothing of it is held
    w.nodes["node-a"] = node_facts(
        "node-a", uid="uid-new", boot_id="boot-2", unhealthy={2: ROW_REMAP}, allocations=None
    )
    await one_round(w, r)
    assert len(w.store.episodes()) == 2


@pytest.mark.parametrize(
    ("pool", "owners", "pools", "managed", "state", "reason", "event"),
    [
        (
            "gpu-b",
            (CLAIM,),
            ("gpu-a",),
            False,
            "Skipped",
            "PoolNotAllowed",
            "NodeReplacementSkipped",
        ),
        (None, (CLAIM,), ("gpu-a",), False, "Skipped", "NoPool", "NodeReplacementSkipped"),
        ("gpu-a", (), ("gpu-a",), False, "Failed", "NodeClaimNotFound", "NodeReplacementFailed"),
        ("gpu-a", (CLAIM,), ("gpu-a",), True, "Skipped", "ManagedRepair", "NodeReplacementSkipped"),
    ],
)
async def test_not_replaced_says_why_and_deletes_nothing(
    pool: str | None,
    owners: tuple[tuple[str, str, str, str], ...],
    pools: tuple[str, ...],
    managed: bool,
    state: str,
    reason: str,
    event: str,
) -> None:
    w = world(pool, owners)
    cfg = settings(replace=replacing(*(ReplacePool(pool=p) for p in pools)))
    registry = CollectorRegistry()
    r = runner_for(w, cfg, registry=registry)
    await drive(w, r, lambda: any(e.phase is Phase.ESCALATED for e in w.store.episodes()))
    if managed:
        w.nodes["node-a"] = replace(
            w.nodes["node-a"], conditions=(("AcceleratedHardwareReady", "False"),)
        )
    for _ in range(3):
        await one_round(w, r)
    ep = only(w)
    rep = ep.status.replacement
    assert rep is not None and (rep.state, rep.reason) == (state, reason)
    assert w.replaced == [] and "nc-1" in w.nodeclaims and "node-a" in w.nodes
    assert [n for _, n in w.notes].count(event) == 1  # told once
    result = "skipped" if state == "Skipped" else "failed"
    assert samples(registry, result, rep.method or "none") == 1
    assert ep.status.reason == "ContactSupport"  # why it escalated, the RMA label's value


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({}, "NodeClaimNotFound"),  # named by the Node, does not exist
        ({"nc-1": ("uid-nc-1", "node-b", "gpu-a")}, "TargetMismatch"),  # another node's
        ({"nc-1": ("uid-nc-1", "node-a", "gpu-b")}, "TargetMismatch"),  # another pool's
        ({"nc-1": ("uid-other", "node-a", "gpu-a")}, "TargetMismatch"),  # made again
    ],
)
async def test_a_nodeclaim_checked_again_that_is_not_the_nodes_is_left_alone(
    claims: dict[str, tuple[str, str, str]], reason: str
) -> None:
    w = world()
    w.nodeclaims = dict(claims)
    r = runner_for(w, settings(replace=replacing(ReplacePool(pool="gpu-a"))))
    await drive(
        w,
        r,
        lambda: any(
            e.status.replacement is not None and e.status.replacement.state == "Failed"
            for e in w.store.episodes()
        ),
    )
    rep = only(w).status.replacement
    assert rep is not None and rep.reason == reason
    assert w.replaced == [] and w.nodeclaims == claims
    assert (only(w).name, "NodeReplacementFailed") in w.notes


async def test_a_delete_whose_answer_was_lost_is_sent_again_and_counted_done() -> None:
    w = world()
    w.replacer_fails = 1  # deleted, then the answer lost
    r = runner_for(w, settings(replace=replacing(ReplacePool(pool="gpu-a"))))
    await drive(w, r, lambda: bool(w.replaced))
    assert only(w).status.replacement.state == "Requested"  # type: ignore[union-attr]
    await one_round(w, r)  # sent again: the NodeClaim is gone, deleted by the first
    rep = only(w).status.replacement
    assert rep is not None and rep.state == "Deleted"
    assert w.replaced == [("nodeclaim", "nc-1")] and w.statuses_at_delete == ["Requested"] * 2


async def test_a_dry_run_or_an_opted_out_node_replaces_nothing() -> None:
    w = world()
    r = runner_for(w, settings(replace=replacing(ReplacePool(pool="gpu-a"))))
    await drive(w, r, lambda: any(e.phase is Phase.ESCALATED for e in w.store.episodes()))
    r.settings = settings(replace=replacing(ReplacePool(pool="gpu-a")), dry_run=True)
    for _ in range(3):
        await one_round(w, r)
    assert w.replaced == [] and only(w).status.replacement is None
    r.settings = settings(replace=replacing(ReplacePool(pool="gpu-a")))
    w.nodes["node-a"] = replace(
        w.nodes["node-a"], labels={**w.nodes["node-a"].labels, KEYS.opt_out_label: "disabled"}
    )
    for _ in range(3):
        await one_round(w, r)
    assert w.replaced == [] and only(w).status.replacement is None


async def test_the_breaker_holds_a_replacement_without_touching_the_escalation() -> None:
    w = world()
    r = runner_for(w, settings(replace=replacing(ReplacePool(pool="gpu-a"))))
    await drive(w, r, lambda: any(e.phase is Phase.ESCALATED for e in w.store.episodes()))
    w.gate_open = False
    for _ in range(3):
        await one_round(w, r)
    ep = only(w)
    assert w.replaced == [] and ep.status.replacement is None
    assert ep.status.reason == "ContactSupport"
    assert w.nodes["node-a"].labels[KEYS.rma_label] == "contact-support"
    w.gate_open = True
    await one_round(w, r)
    assert w.replaced == [("nodeclaim", "nc-1")]


async def test_a_node_group_node_is_cordoned_drained_then_deleted() -> None:
    w = world(owners=())
    w.add(pod("job-1", "node-a", gpus=8), pod("job-2", "node-a", gpus=0))
    cfg = settings(replace=replacing(ReplacePool(pool="gpu-a", method="node")))
    registry = CollectorRegistry()
    r = runner_for(w, cfg, registry=registry)
    await drive(w, r, lambda: "node-a" not in w.nodes)
    ep = only(w)
    assert w.replaced == [("node", "node-a")]
    assert {"job-1", "job-2"} <= set(w.evicted)
    assert w.statuses_at_delete == ["Requested"]
    # cordoned before the first eviction: the delete found it cordoned
    assert ("evict", "node-a") in {(g.kind, g.node) for g in w.gate_requests}
    await one_round(w, r)
    assert only(w).status.replacement.state == "Completed"  # type: ignore[union-attr]
    assert samples(registry, "requested", "node") == 1
    assert ep.name == only(w).name


async def test_a_drain_that_does_not_end_fails_the_replacement_and_deletes_nothing() -> None:
    from gpuhealth.controller.remediation.facts import PdbFacts

    w = world(owners=())
    w.add(pod("guarded", "node-a", gpus=8, labels={"app": "g"}))
    w.pdbs_list.append(PdbFacts(namespace="work", name="pdb", match_labels={"app": "g"}))
    cfg = settings(replace=replacing(ReplacePool(pool="gpu-a", method="node"), drain_timeout_s=60))
    r = runner_for(w, cfg)
    await drive(
        w,
        r,
        lambda: any(
            e.status.replacement is not None and e.status.replacement.state == "Failed"
            for e in w.store.episodes()
        ),
    )
    rep = only(w).status.replacement
    assert rep is not None and rep.reason == "DrainTimeout"
    assert "node-a" in w.nodes and w.replaced == []


def test_the_replacer_checks_its_target_again() -> None:
    act = ReplaceNode(
        node="n1",
        node_uid="u1",
        method="nodeclaim",
        pool="gpu-a",
        node_claim="nc",
        node_claim_uid="uc",
    )
    claim = {
        "metadata": {"uid": "uc", "labels": {POOL: "gpu-a"}},
        "status": {"nodeName": "n1"},
    }
    assert nodeclaim_mismatch(claim, act) == ""
    assert "another UID" in nodeclaim_mismatch({**claim, "metadata": {"uid": "x"}}, act)
    assert "names node n2" in nodeclaim_mismatch({**claim, "status": {"nodeName": "n2"}}, act)
    other_pool = {**claim, "metadata": {"uid": "uc", "labels": {POOL: "b"}}}
    assert "NodePool b" in nodeclaim_mismatch(other_pool, act)
    node = {"metadata": {"uid": "u1"}, "spec": {"unschedulable": True}}
    assert node_mismatch(node, act) == ""
    assert "UID changed" in node_mismatch({"metadata": {"uid": "u2"}}, act)
    by_node = replace(act, method="node")
    assert "no longer cordoned" in node_mismatch({"metadata": {"uid": "u1"}, "spec": {}}, by_node)


async def test_a_managed_repairer_owns_the_node_gpuhealth_holds_and_records() -> None:
    """EKS's node monitoring agent says the GPUs are not ready: the episode is held (no
    quarantine, no drain, no order), who owns the repair is recorded, told once, counted;
    when the condition clears the episode goes on."""
    w = World()
    xid = fault_condition("xid-48", "RESET_GPU")
    owned = (("AcceleratedHardwareReady", "False"),)
    w.nodes["node-a"] = node_facts("node-a", unhealthy={0: xid}, allocations=None, conditions=owned)
    w.add(pod("job", "node-a", gpus=1))
    registry = CollectorRegistry()
    r = runner_for(w, settings(), registry=registry)
    for _ in range(4):
        await one_round(w, r)
        w.advance(5)
    ep = only(w)
    assert ep.phase is Phase.PENDING and ep.status.reason == "ManagedRepair"
    mr = ep.status.managed_repair
    assert mr is not None and (mr.owner, mr.signal) == (
        "eks-node-auto-repair",
        "AcceleratedHardwareReady=False",
    )
    assert [n for _, n in w.notes].count("ManagedRepairOwnsNode") == 1
    assert w.evicted == [] and not w.nodes["node-a"].taints
    labels = {"owner": "eks-node-auto-repair"}
    assert registry.get_sample_value("gpuhealth_remediation_managed_repairs_total", labels) == 1
    assert (
        registry.get_sample_value("gpuhealth_remediation_holds_total", {"reason": "ManagedRepair"})
        == 1
    )
    w.nodes["node-a"] = replace(w.nodes["node-a"], conditions=())
    await drive(w, r, lambda: only(w).phase is Phase.RETURNED)
    assert only(w).status.managed_repair is not None  # the record stays


async def test_managed_repair_off_or_another_clouds_node() -> None:
    """An AKS rule needs an AKS node (its pool label); with managed_repair off nothing is."""
    w = World()
    xid = fault_condition("xid-48", "RESET_GPU")
    w.nodes["node-a"] = node_facts(
        "node-a", unhealthy={0: xid}, allocations=None, conditions=(("Ready", "False"),)
    )
    r = runner_for(w, settings())
    await one_round(w, r)
    assert only(w).status.reason != "ManagedRepair"
    w2 = World()
    w2.nodes["node-a"] = node_facts(
        "node-a",
        unhealthy={0: xid},
        allocations=None,
        conditions=(("AcceleratedHardwareReady", "False"),),
    )
    r2 = runner_for(w2, settings(managed_repair=ManagedRepairSettings(enabled=False)))
    await one_round(w2, r2)
    assert only(w2).phase is not Phase.PENDING


@pytest.mark.parametrize(
    ("reason", "pool", "owners", "want"),
    [
        ("ContactSupport", "gpu-a", (CLAIM,), ("Requested", "Requested", "contact-support")),
        ("DrainTimeout", "gpu-a", (CLAIM,), ("Requested", "Requested", "drain-timeout")),
        # the agent cannot act: nothing says the hardware is bad, no RMA, never replaced
        ("NoExecutor", "gpu-a", (CLAIM,), ("Skipped", "NotTheHardware", "")),
        ("NoExecutor", "gpu-b", (CLAIM,), ("Skipped", "NotTheHardware", "")),
        ("ContactSupport", "gpu-b", (CLAIM,), ("Skipped", "PoolNotAllowed", "contact-support")),
        ("ContactSupport", "gpu-a", (), ("Failed", "NodeClaimNotFound", "contact-support")),
    ],
)
def test_the_replacement_decision(
    reason: str,
    pool: str,
    owners: tuple[tuple[str, str, str, str], ...],
    want: tuple[str, str, str],
) -> None:
    """The pure decision (:func:`replacement_step`) on an Escalated episode, table-driven: the
    escalation's reason, the node's pool and owners decide; only a request carries an action."""
    ep = episode(Phase.ESCALATED, reason=reason)
    node = node_facts(
        "node-a", unhealthy={2: ROW_REMAP}, labels={POOL: pool}, owners=owners, allocations=None
    )
    cfg = settings(replace=replacing(ReplacePool(pool="gpu-a")))
    step = replacement_step(ep, node, Observed(now=NOW, node=node), Context(cfg, KEYS))
    rep = step.status.replacement
    assert rep is not None and (rep.state, rep.reason, rep.rma) == want
    assert [type(a) for a in step.actions] == ([ReplaceNode] if want[0] == "Requested" else [])


@pytest.mark.parametrize(
    ("state", "method", "cordoned"),
    [
        ("Draining", "node", True),
        ("Draining", "nodeclaim", True),
        # Written ahead of the delete, which checks the cordon right before it acts: lifting
        # it in between refused the delete (seen in the full integration suite).
        ("Requested", "node", True),
        ("Requested", "nodeclaim", False),  # Karpenter drains and cordons a NodeClaim's node
        ("Deleted", "node", False),
        ("Completed", "node", False),
        ("Failed", "node", False),
        ("Skipped", "node", False),
    ],
)
def test_the_cordon_is_held_while_the_node_method_drains_and_until_its_delete(
    state: str, method: str, cordoned: bool
) -> None:
    import msgspec

    from gpuhealth.controller.remediation.model import ReplacementStatus
    from gpuhealth.controller.remediation.replacing import holds_cordon

    ep = episode(Phase.ESCALATED)
    with_replacement = msgspec.structs.replace(
        ep,
        status=msgspec.structs.replace(
            ep.status,
            replacement=ReplacementStatus(state=state, method=method),  # type: ignore[arg-type]
        ),
    )
    assert holds_cordon(with_replacement) is cordoned
    assert not holds_cordon(ep)
