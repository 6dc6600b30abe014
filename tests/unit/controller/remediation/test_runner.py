"""The runner over an in-memory world: whole episodes, one per action, and their failures."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

from gpuhealth.controller.breaker.gate import GateDecision, HardWrite
from gpuhealth.controller.remediation.facts import PdbFacts
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.settings import (
    DrainSettings,
    RebootSettings,
    ResetSettings,
    SafetySettings,
    ValidationPodSettings,
    ValidationSettings,
)
from gpuhealth.protocol import Allocation
from tests.fakes.remediation_world import (
    KEYS,
    T0,
    World,
    fault_condition,
    gpu_uuid,
    node_facts,
    pod,
)
from tests.support.remediation import (
    drive,
    finished,
    one_round,
    only,
    phase_is,
    runner_for,
    settings,
)

XID48 = fault_condition("xid-48", "RESET_GPU")
XID79 = fault_condition("xid-79", "RESTART_BM")
ROW_REMAP = fault_condition("row-remap-failure", "CONTACT_SUPPORT")


def alloc(pod_name: str, gpu: int, namespace: str = "work") -> Allocation:
    return Allocation(
        namespace=namespace,
        pod=pod_name,
        container="main",
        gpu_uuid=gpu_uuid(gpu),
        device_id=gpu_uuid(gpu),
    )


def reset_world() -> World:
    """GPU 3 has XID 48 (reset); a pod on it, a pod on GPU 1, a DaemonSet and a static pod."""
    w = World()
    w.nodes["node-a"] = node_facts(
        unhealthy={3: XID48}, allocations=(alloc("on-gpu3", 3), alloc("on-gpu1", 1))
    )
    w.add(
        pod("on-gpu3"),
        pod("on-gpu1"),
        pod("agent", namespace="gpuhealth", owners=(("DaemonSet", "agent"),), gpus=0),
        pod(
            "static",
            namespace="kube-system",
            annotations={"kubernetes.io/config.mirror": "x"},
            gpus=0,
        ),
    )
    return w


async def test_reset_episode_returns_the_node_after_a_partial_drain() -> None:
    w = reset_world()
    r = runner_for(w, settings())
    await drive(w, r, finished(w))
    ep = only(w)
    assert ep.spec.action == "reset-gpu" and ep.spec.scope == "gpu"
    assert w.evicted == ["on-gpu3"]  # only the pod on the failed GPU
    assert [o for o, n in w.executed.items() if n] == [
        f"{ep.spec.fault.fingerprint}-reset-gpu-1",
        f"{ep.spec.fault.fingerprint}-validate-1",
    ]
    t = ep.status.times
    assert t.detected <= t.quarantined <= t.drained <= t.remediated <= t.validated <= t.returned  # type: ignore[operator]
    assert not w.nodes["node-a"].has_taint(KEYS.quarantine_taint)
    assert ep.status.evicted_count == 1 and ep.status.evicted_pods[0].name == "on-gpu3"
    assert ("RemediationStarted" in {n for _, n in w.notes}) and (
        "NodeReturned" in {n for _, n in w.notes}
    )


async def test_reboot_waits_for_approval_then_reboots_once() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={0: XID79})
    w.add(pod("job", gpus=0))  # full drain: every pod goes, GPU or not
    r = runner_for(w, settings(reboot=RebootSettings(enabled=True, approval_required=True)))
    await drive(w, r, lambda: only(w).status.reason == "AwaitingApproval", rounds=5)
    assert w.evicted == [] and not w.pending_reboots
    w.store.annotate(only(w).name, KEYS.approve_annotation, "alice")
    await drive(w, r, finished(w))
    ep = only(w)
    assert ep.status.approved_by == "alice"
    assert w.evicted == ["job"]
    assert w.executed[f"{ep.spec.fault.fingerprint}-reboot-1"] == 1
    assert w.nodes["node-a"].boot_id == "boot-1+1"


async def test_contact_support_escalates_with_rma_label_and_release_revalidates() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={2: ROW_REMAP})
    w.add(pod("p"))
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.ESCALATED))
    await one_round(w, r)
    ep = only(w)
    assert ep.status.reason == "ContactSupport"
    assert w.nodes["node-a"].labels[KEYS.rma_label] == "contact-support"
    assert w.nodes["node-a"].has_taint(KEYS.quarantine_taint)  # quarantine kept
    assert w.evicted == []  # escalation drains nothing by itself
    w.clear_verdicts("node-a")  # the GPU was replaced
    w.store.annotate(ep.name, KEYS.release_annotation, "bob: GPU swapped")
    await drive(w, r, finished(w))
    assert KEYS.rma_label not in w.nodes["node-a"].labels
    assert only(w).status.release_handled == "bob: GPU swapped"


async def test_failed_validation_escalates() -> None:
    w = reset_world()
    w.agent.validate = "failed"
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.ESCALATED))
    ep = only(w)
    assert ep.status.reason == "ValidationFailed"
    assert "soak" in ep.status.message
    await one_round(w, r)
    assert w.nodes["node-a"].labels[KEYS.rma_label] == "validation-failed"
    assert w.nodes["node-a"].has_taint(KEYS.quarantine_taint)


async def test_new_fault_during_validation_escalates() -> None:
    w = reset_world()
    w.agent.validate = "never"  # no verdict from the agent yet
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.VALIDATING))
    w.advance(5)
    w.nodes["node-a"] = replace(
        node_facts(unhealthy={3: fault_condition("xid-48", "RESET_GPU", since=w.clock.now())}),
        taints=w.nodes["node-a"].taints,  # still quarantined
    )
    await one_round(w, r)
    assert only(w).phase is Phase.ESCALATED
    assert "became unhealthy during validation" in only(w).status.message


async def test_busy_gpu_reset_retries_then_escalates() -> None:
    w = reset_world()
    w.agent.reset = "refused"
    cfg = settings(reset_gpu=ResetSettings(enabled=True, max_attempts=2, retry_s=30))
    r = runner_for(w, cfg)
    await drive(w, r, phase_is(w, Phase.ESCALATED), tick_s=10)
    ep = only(w)
    fp = ep.spec.fault.fingerprint
    assert w.executed[f"{fp}-reset-gpu-1"] == 1 and w.executed[f"{fp}-reset-gpu-2"] == 1
    assert f"{fp}-reset-gpu-3" not in w.executed
    assert ep.status.reason == "ResetRefused" and "gpu-busy" in ep.status.message


async def test_pdb_blocks_eviction_retries_never_deletes() -> None:
    from gpuhealth.controller.remediation.facts import PdbFacts

    w = reset_world()
    w.pdbs_list.append(
        PdbFacts(namespace="work", name="keep", match_labels={"app": "x"}, disruptions_allowed=0)
    )
    w.add(pod("on-gpu3", labels={"app": "x"}))
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10, timeout_s=600)))
    await drive(w, r, lambda: w.eviction_attempts["uid-work-on-gpu3"] >= 3, tick_s=10)
    ep = only(w)
    assert ep.phase is Phase.DRAINING
    assert w.evicted == [] and w.force_deleted == []
    assert [p.reason for p in ep.status.waiting_pods] == ["pdb-blocked"]
    w.pdbs_list[0] = PdbFacts(
        namespace="work", name="keep", match_labels={"app": "x"}, disruptions_allowed=1
    )
    await drive(w, r, finished(w), tick_s=10)
    assert w.evicted == ["on-gpu3"]


async def test_drain_timeout_escalates_with_the_blocked_pods() -> None:
    from gpuhealth.controller.remediation.facts import PdbFacts

    w = reset_world()
    w.pdbs_list.append(
        PdbFacts(namespace="work", name="keep", selects_all=True, disruptions_allowed=0)
    )
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10, timeout_s=60)))
    await drive(w, r, phase_is(w, Phase.ESCALATED), tick_s=10)
    ep = only(w)
    assert ep.status.reason == "DrainTimeout" and "pdb-blocked" in ep.status.message
    assert w.force_deleted == []


async def test_validation_pod_is_created_and_must_succeed() -> None:
    w = reset_world()
    cfg = settings(
        validation=ValidationSettings(
            soak_s=0, pod=ValidationPodSettings(namespace="gpu-checks", spec={"containers": []})
        )
    )
    r = runner_for(w, cfg)
    await drive(w, r, finished(w))
    ep = only(w)
    assert ep.status.validation is not None and ep.status.validation.pod_passed
    assert list(w.validation_pods) == [f"gpuhealth-validate-{ep.spec.fault.fingerprint}-1"]


async def test_undelivered_order_is_sent_again() -> None:
    w = reset_world()
    w.agent.connected = False
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.REMEDIATING))
    await drive(w, r, lambda: "not delivered" in only(w).status.last_error, rounds=3)
    assert only(w).status.order is not None and not only(w).status.order.delivered  # type: ignore[union-attr]
    w.agent.connected = True
    await drive(w, r, finished(w))


async def test_reboot_timeout_escalates_when_the_boot_id_never_changes() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={0: XID79})
    w.agent.reboot = False
    r = runner_for(
        w, settings(reboot=RebootSettings(enabled=True, approval_required=False, timeout_s=120))
    )
    await drive(w, r, phase_is(w, Phase.ESCALATED), tick_s=30)
    assert only(w).status.reason == "RebootTimeout"


async def test_external_reboot_executor_sends_nothing() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={0: XID79})
    cfg = settings(
        reboot=RebootSettings(enabled=True, approval_required=False, executor="external")
    )
    r = runner_for(w, cfg)
    await drive(w, r, lambda: only(w).status.reason == "AwaitingExternalReboot")
    assert not w.executed
    n = w.nodes["node-a"]
    w.nodes["node-a"] = msgspec_replace_boot(n, "boot-2")
    w.clear_verdicts("node-a")
    await drive(w, r, finished(w))


def msgspec_replace_boot(n, boot):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(n, boot_id=boot)


@pytest.mark.parametrize("actions", ["reset", "reboot"])
async def test_disabled_actions_start_nothing(actions: str) -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={0: XID48 if actions == "reset" else XID79})
    cfg = settings(reset_gpu=ResetSettings(enabled=False), reboot=RebootSettings(enabled=False))
    r = runner_for(w, cfg)
    await one_round(w, r)
    assert w.store.episodes() == []


async def test_loop_off_by_default_starts_nothing() -> None:
    from gpuhealth.controller.remediation.settings import RemediationSettings

    w = reset_world()
    r = runner_for(w, RemediationSettings())
    await one_round(w, r)
    assert w.store.episodes() == [] and w.evicted == []


async def test_dry_run_records_the_plan_and_changes_nothing() -> None:
    w = reset_world()
    r = runner_for(w, settings(dry_run=True))
    await drive(w, r, lambda: only(w).status.reason == "DryRun", rounds=3)
    ep = only(w)
    assert ep.phase is Phase.PENDING
    assert "would reset-gpu" in ep.status.message and "work/on-gpu3" in ep.status.message
    assert "work/on-gpu1" not in ep.status.message
    assert w.evicted == [] and not w.executed and not w.gate_requests
    assert not w.nodes["node-a"].has_taint(KEYS.quarantine_taint)


async def test_opt_out_label_holds_an_episode_in_flight() -> None:
    w = reset_world()
    w.agent.connected = False
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.DRAINING))
    n = w.nodes["node-a"]
    from dataclasses import replace

    w.nodes["node-a"] = replace(n, labels={**n.labels, KEYS.opt_out_label: "disabled"})
    await drive(w, r, lambda: only(w).status.reason == "OptedOut", rounds=3)
    attempts = sum(w.eviction_attempts.values())
    w.advance(7200)  # far past every timeout: a hold never escalates
    await one_round(w, r)
    assert only(w).phase is not Phase.ESCALATED
    assert sum(w.eviction_attempts.values()) == attempts


async def test_abort_annotation_fails_the_episode_and_keeps_the_quarantine() -> None:
    w = reset_world()
    w.agent.connected = False
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.REMEDIATING))
    w.store.annotate(only(w).name, KEYS.abort_annotation, "carol: investigating by hand")
    await one_round(w, r)
    ep = only(w)
    assert ep.phase is Phase.FAILED and ep.status.reason == "Aborted"
    assert "carol" in ep.status.message
    assert w.nodes["node-a"].has_taint(KEYS.quarantine_taint)


async def test_node_deleted_mid_episode_fails_it() -> None:
    w = reset_world()
    w.agent.connected = False
    r = runner_for(w, settings())
    await drive(w, r, phase_is(w, Phase.REMEDIATING))
    del w.nodes["node-a"]
    await one_round(w, r)
    assert only(w).phase is Phase.FAILED and only(w).status.reason == "NodeGone"


async def test_conflict_on_status_write_repeats_the_pass_without_double_actions() -> None:
    """Every status write that follows an action fails once (as if the controller died
    between acting and recording): the next pass repeats the step; nothing happens twice."""
    from gpuhealth.controller.kube.rest import ConflictError

    w = reset_world()
    r = runner_for(w, settings())
    conflicts = 0
    for _ in range(40):
        for node in sorted(w.nodes):
            await r.consider(node)
        for ep in w.store.episodes():
            w.store.conflict_next = 1
            try:
                await r.reconcile(ep.name)
            except ConflictError:
                conflicts += 1
            w.store.conflict_next = 0
            await r.reconcile(ep.name)
        w.settle()
        w.advance(5)
        if finished(w)():
            break
    assert finished(w)() and conflicts >= 6
    assert all(n == 1 for n in w.executed.values()), w.executed
    assert w.evicted == ["on-gpu3"]


def test_safety_defaults_are_conservative() -> None:
    cfg = SafetySettings()
    assert cfg.max_concurrent == 1 and cfg.max_fraction <= 0.1
    assert T0.tzinfo is not None


def gang_world(other_nodes: int) -> World:
    """GPU 3's pod is one member of a JobSet that also runs on ``other_nodes`` healthy nodes."""
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={3: XID48}, allocations=(alloc("train-a", 3),))
    js = {"jobset.sigs.k8s.io/jobset-name": "train"}
    w.add(pod("train-a", labels=js))
    for i in range(other_nodes):
        w.nodes[f"node-{i}"] = node_facts(name=f"node-{i}")
        w.add(pod(f"train-{i}", f"node-{i}", labels=js))
    return w


async def test_every_node_a_gang_eviction_lands_on_is_charged_before_any_eviction() -> None:
    w = gang_world(3)
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10)))
    refused = "node-2"
    real_request = w.request

    def request(write: HardWrite) -> GateDecision:
        if write.node == refused:
            w.gate_requests.append(write)
            return GateDecision(allowed=False, reason="BreakerOpen", message="breaker open")
        return real_request(write)

    w.request = request  # type: ignore[method-assign]
    await drive(w, r, lambda: only(w).status.reason == "BreakerOpen", tick_s=10)
    evicts = {x.node for x in w.gate_requests if x.kind == "evict"}
    assert evicts == {"node-a", "node-0", "node-1", "node-2"}
    assert w.evicted == []  # one node refused: no member anywhere is evicted
    refused = ""
    await drive(w, r, finished(w), tick_s=10)
    assert sorted(w.evicted) == ["train-0", "train-1", "train-2", "train-a"]
    assert only(w).status.touched_nodes == ["node-0", "node-1", "node-2"]


async def test_a_gang_over_the_caps_is_held_whole_with_an_event_and_a_metric() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    w = gang_world(10)
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10, timeout_s=300)), registry=registry)
    await drive(w, r, lambda: only(w).status.reason == "BlastRadiusCap", tick_s=10)
    writes = w.store.writes
    for _ in range(5):
        await one_round(w, r)
        w.advance(10)
    assert w.store.writes == writes  # held: the status stays as it is, nothing is written
    ep = only(w)
    assert ep.phase is Phase.DRAINING and "drain.max_other_nodes (4)" in ep.status.message
    assert w.evicted == [] and not [x for x in w.gate_requests if x.kind == "evict"]
    assert [n for _, n in w.notes].count("BlastRadiusCap") == 1
    held = registry.get_sample_value(
        "gpuhealth_remediation_holds_total", {"reason": "BlastRadiusCap"}
    )
    assert held == 1
    await drive(w, r, phase_is(w, Phase.ESCALATED), tick_s=30)
    assert only(w).status.reason == "DrainTimeout" and w.evicted == []


async def test_a_validation_pod_someone_else_made_fails_the_validation() -> None:
    """Someone made pods of the names the loop would use (same labels, owner and node: the
    API lets anyone who may create pods there copy them), succeeded: none is accepted, the
    loop tries new names, then escalates; the node never returns on their word."""
    from gpuhealth.controller.remediation.facts import ValidationPodFacts
    from gpuhealth.controller.remediation.validating import MAX_POD_TRIES, pod_name

    w = reset_world()
    cfg = settings(
        validation=ValidationSettings(
            soak_s=0, pod=ValidationPodSettings(namespace="v", spec={"containers": []})
        )
    )
    r = runner_for(w, cfg)
    await drive(w, r, phase_is(w, Phase.REMEDIATING))
    ep = only(w)
    for tries in range(MAX_POD_TRIES):
        name = pod_name(ep, 1, tries)
        w.validation_pods[name] = ValidationPodFacts(name=name, phase="Succeeded", uid="forged")
    await drive(w, r, phase_is(w, Phase.ESCALATED))
    ep = only(w)
    assert ep.status.reason == "ValidationPodNotOurs", ep.status.message
    assert ep.status.validation is not None and not ep.status.validation.pod_passed
    assert w.nodes["node-a"].labels[KEYS.rma_label] == "validation-pod-not-ours"


async def test_dry_run_preview_says_a_drain_over_the_caps_would_be_held() -> None:
    w = gang_world(10)
    r = runner_for(w, settings(dry_run=True))
    await drive(w, r, lambda: only(w).status.reason == "DryRun")
    message = only(w).status.message
    assert "but held: the drain would evict pods on 10 other nodes" in message
    assert "drain.max_other_nodes (4)" in message and w.evicted == []


async def test_a_gang_member_on_an_opted_out_node_holds_the_episode() -> None:
    w = gang_world(2)
    n = w.nodes["node-1"]
    w.nodes["node-1"] = replace(n, labels={**n.labels, KEYS.opt_out_label: "disabled"})
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10)))
    await drive(w, r, lambda: only(w).status.reason == "BlastRadiusCap", tick_s=10)
    assert "node-1" in only(w).status.message and w.evicted == []


async def test_a_gang_wider_than_the_breakers_room_is_held_without_tripping_it() -> None:
    """A fleet of 30 GPU nodes (breaker budget 3) and one gang over four other nodes: the
    drain checks the breaker's room for all five nodes before its first eviction and holds
    (``BlastRadiusCap``), the breaker closed and untouched. Asked node by node, the gate
    admitted two and tripped on the third: a fleet-wide stop, and nothing evicted."""
    from gpuhealth.controller.breaker.gate import CircuitBreaker, WriteGate
    from gpuhealth.controller.breaker.settings import BreakerSettings
    from gpuhealth.controller.remediation.assembly import GateRoom

    w = gang_world(4)
    for i in range(25):  # healthy GPU nodes: the breaker's denominator
        w.nodes[f"idle-{i}"] = node_facts(name=f"idle-{i}")
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.1, min_nodes=1), w.clock)
    gate = WriteGate(breaker, gpu_nodes=lambda: len(w.nodes))
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10, timeout_s=600)))
    r.p.gate = gate
    r.p.room = GateRoom(gate)
    await drive(w, r, lambda: only(w).status.reason == "BlastRadiusCap", tick_s=10)
    ep = only(w)
    assert ep.phase is Phase.DRAINING and "has room for 2 more" in ep.status.message
    assert w.evicted == [] and {p.reason for p in ep.status.waiting_pods} == {"over-cap"}
    status = breaker.status()
    assert not status.open and status.trips == 0 and status.recent_nodes == 1  # node-a only
    # room made: the window of the first admission passes, more GPU nodes join
    for i in range(25, 60):
        w.nodes[f"idle-{i}"] = node_facts(name=f"idle-{i}")
    await drive(w, r, finished(w), tick_s=10)
    assert sorted(w.evicted) == ["train-0", "train-1", "train-2", "train-3", "train-a"]
    assert breaker.status().trips == 0


async def test_a_status_write_lost_after_the_evictions_never_undercounts() -> None:
    """The status is written ahead of each eviction round: when the write after the round
    is lost, the stored episode still counts the evicted pods and keeps the frozen gang and
    the nodes it touched, so the caps of later rounds count them. Before, the round's
    frozenGangs, touchedNodes and evicted count were written only after the evictions."""
    from gpuhealth.common.errors import TransientError
    from gpuhealth.controller.remediation.model import Status

    w = gang_world(3)
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10)))
    real = w.store.write_status
    lost: list[int] = []

    async def write_status(ep, status: Status):  # type: ignore[no-untyped-def]
        if w.evicted and not lost:  # the write right after the first round: lost
            lost.append(len(w.evicted))
            raise TransientError("the API server went away")
        return await real(ep, status)

    w.store.write_status = write_status  # type: ignore[method-assign]
    await drive(w, r, lambda: only(w).phase is Phase.DRAINING)
    while not lost:
        with contextlib.suppress(TransientError):
            await one_round(w, r)
        w.advance(10)
    assert lost == [4]
    ep = only(w)  # as stored: the write-ahead, not the lost write
    assert ep.status.evicted_count == 4
    assert ep.status.touched_nodes == ["node-0", "node-1", "node-2"]
    (gang,) = ep.status.frozen_gangs
    assert gang.kind == "jobset" and len(gang.uids) == 4
    assert {p.reason for p in ep.status.evicted_pods} == {"evicting"}
    await drive(w, r, finished(w), tick_s=10)
    assert only(w).status.evicted_count == 4  # counted once
    assert sorted(w.evicted) == ["train-0", "train-1", "train-2", "train-a"]


async def test_a_refused_eviction_is_given_back_to_the_count() -> None:
    w = reset_world()
    w.pdbs_list.append(
        PdbFacts(namespace="work", name="keep", selects_all=True, disruptions_allowed=0)
    )
    r = runner_for(w, settings(drain=DrainSettings(retry_s=10)))
    await drive(w, r, lambda: bool(w.blocked))
    ep = only(w)
    assert ep.status.evicted_count == 0 and ep.status.evicted_pods == []
    assert [p.reason for p in ep.status.waiting_pods] == ["pdb-blocked"]
