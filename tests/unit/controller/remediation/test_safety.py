"""Safety: the breaker stops a storm, the concurrency cap, escalation limits, episode
identity (stale events, repeats), and hand-made GPURemediations that the controller did not
derive itself."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import msgspec
import pytest

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import ACTIVE_PHASES, Phase
from gpuhealth.controller.remediation.runner import ShardCaps
from gpuhealth.controller.remediation.safety import concurrency_limit
from gpuhealth.controller.remediation.settings import RebootSettings, SafetySettings
from tests.fakes.remediation_world import KEYS, T0, World, fault_condition, node_facts, pod
from tests.support.breaker_gate import BreakerGate
from tests.support.clock import FakeClock
from tests.support.remediation import drive, finished, one_round, only, runner_for, settings

XID48 = fault_condition("xid-48", "RESET_GPU")


def storm_world(nodes: int, faulted: int) -> World:
    w = World()
    for i in range(nodes):
        name = f"node-{i:02d}"
        w.nodes[name] = node_facts(
            name, unhealthy={0: XID48} if i < faulted else None, allocations=None
        )
        w.add(pod(f"p-{i:02d}", name))
    return w


async def test_breaker_stops_a_50_percent_storm() -> None:
    w = storm_world(20, 10)
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.1, window_s=600), w.clock)
    r = runner_for(w, settings())
    r.p.gate = BreakerGate(breaker, lambda: 20)
    for _ in range(6):
        await one_round(w, r)
        w.advance(5)
    phases = [e.phase for e in w.store.episodes()]
    assert len(phases) == 10
    moved = [e for e in w.store.episodes() if e.phase is not Phase.PENDING]
    assert len(moved) <= 2, [(e.node, e.phase) for e in moved]
    assert breaker.is_open and breaker.trips == 1
    blocked = [e for e in w.store.episodes() if e.status.reason == "BreakerOpen"]
    assert len(blocked) >= 8
    touched = {name.split("-", 1)[1] for name in w.evicted}
    assert len(touched) <= 2
    assert "CircuitBreakerOpen" in {n for _, n in w.notes}
    # an operator resets the breaker: the queued episodes go on, within the breaker's budget
    breaker.reset()
    for _ in range(6):
        await one_round(w, r)
        w.advance(5)
    assert sum(1 for e in w.store.episodes() if e.phase is not Phase.PENDING) >= len(moved)


async def test_concurrency_cap_runs_one_episode_at_a_time_oldest_first() -> None:
    w = storm_world(3, 0)
    for i, name in enumerate(sorted(w.nodes)):
        cond = fault_condition("xid-48", "RESET_GPU", since=T0 + timedelta(seconds=10 * (2 - i)))
        w.nodes[name] = node_facts(name, unhealthy={0: cond}, allocations=None)
    cfg = settings(safety=SafetySettings(max_concurrent=1, max_fraction=1.0))
    r = runner_for(w, cfg)
    order: list[str] = []
    for _ in range(120):
        await one_round(w, r)
        active = [
            e
            for e in w.store.episodes()
            if e.phase in (Phase.QUARANTINED, Phase.DRAINING, Phase.REMEDIATING, Phase.VALIDATING)
        ]
        assert len(active) <= 1
        for e in active:
            if e.node not in order:
                order.append(e.node)
        if finished(w)() and len(w.store.episodes()) == 3:
            break
        w.advance(5)
    assert finished(w)()
    assert len(order) == 3


async def test_a_reboot_waiting_for_approval_holds_no_concurrency_slot() -> None:
    """max_concurrent 1: an older reboot waits for its approval in Pending, untouched, while
    a younger reset runs to the end; approved, the reboot then starts."""
    w = storm_world(2, 0)
    older, younger = sorted(w.nodes)
    xid79 = fault_condition("xid-79", "RESTART_BM", since=T0)
    w.nodes[older] = node_facts(older, unhealthy={0: xid79}, allocations=None)
    later = fault_condition("xid-48", "RESET_GPU", since=T0 + timedelta(seconds=30))
    w.nodes[younger] = node_facts(younger, unhealthy={0: later}, allocations=None)
    cfg = settings(
        safety=SafetySettings(max_concurrent=1, max_fraction=1.0),
        reboot=RebootSettings(enabled=True, approval_required=True),
    )
    r = runner_for(w, cfg)
    for _ in range(60):
        await one_round(w, r)
        w.advance(5)
    by_node = {e.node: e for e in w.store.episodes()}
    assert by_node[older].phase is Phase.PENDING, by_node[older].status
    assert by_node[older].status.reason == "AwaitingApproval"
    assert by_node[younger].phase is Phase.RETURNED, by_node[younger].status
    assert not any(name.endswith(older) for name in w.evicted)


def test_concurrency_limit_is_the_lower_of_absolute_and_fraction() -> None:
    cfg = settings(safety=SafetySettings(max_concurrent=10, max_fraction=0.05))
    assert concurrency_limit(1000, cfg) == 10
    assert concurrency_limit(100, cfg) == 5
    assert concurrency_limit(10, cfg) == 1  # never below one

    # Past one process, an owner's part: the parts add up to the cap, a part of 0 starts none.
    assert concurrency_limit(1000, cfg, part=3) == 3
    assert concurrency_limit(100, cfg, part=7) == 5
    assert concurrency_limit(1000, cfg, part=0) == 0


async def test_past_one_process_the_owners_parts_add_up_to_the_cap() -> None:
    """Two shard owners over one storm: each starts at most its part of max_concurrent, so
    the fleet never has more in progress than the cap; the escalation guard counts every
    episode in the cluster, so escalations on one shard stop new episodes on the other."""
    w = storm_world(8, 8)
    cfg = settings(
        safety=SafetySettings(max_concurrent=2, max_fraction=1.0, max_unresolved_escalations=1)
    )
    evens = {n for n in w.nodes if int(n[-2:]) % 2 == 0}
    a, b = runner_for(w, cfg), runner_for(w, cfg)
    a.owns, b.owns = (lambda n: n in evens), (lambda n: n not in evens)
    for r in (a, b):
        r.shards = ShardCaps(part=lambda total: total // 2, every_episode=w.store.episodes)
    started: set[str] = set()
    for _ in range(40):
        await one_round(w, a)
        await one_round(w, b)
        active = [e for e in w.store.episodes() if e.phase in ACTIVE_PHASES]
        assert len(active) <= 2
        assert sum(e.node in evens for e in active) <= 1
        started |= {e.node for e in active}
        w.advance(5)
    assert started & evens and started - evens  # both owners used their part
    # one unreleased escalation on b's shard: a starts nothing new
    w.nodes["node-01"] = node_facts(
        "node-01", unhealthy={0: fault_condition("row-remap-failure", "CONTACT_SUPPORT")}
    )
    await drive(w, b, lambda: any(e.phase is Phase.ESCALATED for e in w.store.episodes()))
    w.nodes["node-02"] = node_facts(
        "node-02",
        unhealthy={0: fault_condition("xid-48", "RESET_GPU", since=w.clock.now())},
        allocations=None,
    )
    for _ in range(4):
        await one_round(w, a)
        w.advance(5)
    waiting = [e for e in w.store.episodes() if e.node == "node-02" and e.phase is Phase.PENDING]
    assert waiting and waiting[-1].status.reason == "TooManyEscalations"


async def test_too_many_unresolved_escalations_stop_new_episodes() -> None:
    w = storm_world(4, 0)
    for name in sorted(w.nodes)[:3]:
        w.nodes[name] = node_facts(
            name, unhealthy={0: fault_condition("row-remap-failure", "CONTACT_SUPPORT")}
        )
    cfg = settings(
        safety=SafetySettings(max_concurrent=100, max_fraction=1.0, max_unresolved_escalations=3)
    )
    r = runner_for(w, cfg)
    await drive(w, r, lambda: sum(e.phase is Phase.ESCALATED for e in w.store.episodes()) == 3)
    w.nodes["node-03"] = node_facts("node-03", unhealthy={0: XID48}, allocations=None)
    for _ in range(4):
        await one_round(w, r)
        w.advance(5)
    waiting = [e for e in w.store.episodes() if e.node == "node-03"]
    assert waiting and waiting[0].phase is Phase.PENDING
    assert waiting[0].status.reason == "TooManyEscalations"
    # releasing one escalation lets the new episode start
    first = sorted(e.name for e in w.store.episodes() if e.phase is Phase.ESCALATED)[0]
    w.store.annotate(first, KEYS.release_annotation, "dave")
    await drive(w, r, lambda: w.store.get(waiting[0].name).phase is not Phase.PENDING)  # type: ignore[union-attr]


async def test_stale_redelivery_of_a_handled_fault_starts_nothing() -> None:
    w = storm_world(1, 1)
    r = runner_for(w, settings())
    await drive(w, r, finished(w))
    first = only(w).name
    # the same verdict (same GPU, code and first-seen time) arrives again, e.g. replayed
    w.nodes["node-00"] = replace(
        w.nodes["node-00"], gpus=node_facts("node-00", unhealthy={0: XID48}).gpus
    )
    await one_round(w, r)
    assert [e.name for e in w.store.episodes()] == [first]
    # the same XID seen again later is a new fault: a new episode
    later = fault_condition("xid-48", "RESET_GPU", since=T0 + timedelta(hours=2))
    w.nodes["node-00"] = replace(
        w.nodes["node-00"], gpus=node_facts("node-00", unhealthy={0: later}).gpus
    )
    await one_round(w, r)
    assert len(w.store.episodes()) == 2


async def test_repeated_faults_escalate_instead_of_looping() -> None:
    w = storm_world(1, 0)
    r = runner_for(
        w, settings(safety=SafetySettings(max_concurrent=10, max_fraction=1.0, repeat_limit=2))
    )
    for n in range(3):
        cond = fault_condition("xid-48", "RESET_GPU", since=w.clock.now())
        w.nodes["node-00"] = replace(
            w.nodes["node-00"], gpus=node_facts("node-00", unhealthy={0: cond}).gpus
        )
        await drive(
            w,
            r,
            lambda n=n: (
                len(w.store.episodes()) == n + 1 and all(e.terminal for e in w.store.episodes())
            ),
        )
        w.advance(60)
    actions = [
        e.spec.action for e in sorted(w.store.episodes(), key=lambda e: e.spec.fault.detected_at)
    ]
    assert actions == ["reset-gpu", "reset-gpu", "escalate"]
    last = max(w.store.episodes(), key=lambda e: e.spec.fault.detected_at)
    assert last.phase is Phase.ESCALATED and last.status.reason == "RepeatedFaults"


@pytest.mark.parametrize(
    "forge",
    ["action", "gpu", "boot"],
)
async def test_hand_made_episodes_the_controller_did_not_derive_do_nothing(forge: str) -> None:
    """Someone with create rights on GPURemediation tries to order a reboot."""
    w = storm_world(2, 1)
    cfg = settings()
    node = w.nodes["node-00"]
    gpus = failed_gpus(node)
    spec = expected_spec("node-00", node.boot_id, gpus, detected_at=T0, history=(), settings=cfg)
    assert spec is not None
    name = episode_name("node-00", spec.fault.fingerprint)
    if forge == "action":
        spec = msgspec.structs.replace(spec, action="reboot", scope="node")
    elif forge == "gpu":  # a healthy node, a made-up fault
        spec = msgspec.structs.replace(spec, node_name="node-01")
        name = episode_name("node-01", spec.fault.fingerprint)
    else:
        fault = msgspec.structs.replace(spec.fault, boot_id="other-boot")
        spec = msgspec.structs.replace(spec, fault=fault)
    await w.store.create(name, spec, {})
    r = runner_for(w, cfg)
    for e in w.store.episodes():
        await r.reconcile(e.name)
    forged = w.store.get(name)
    assert forged is not None and forged.phase is Phase.FAILED
    assert forged.status.reason in {"SpecMismatch", "FaultCleared", "BootChanged"}
    assert not w.gate_requests and not w.executed and not w.evicted


async def test_fault_cleared_while_pending_fails_without_touching_the_node() -> None:
    w = storm_world(1, 1)
    r = runner_for(w, settings())
    await r.consider("node-00")
    w.clear_verdicts("node-00")
    await r.reconcile(only(w).name)
    assert only(w).phase is Phase.FAILED and only(w).status.reason == "FaultCleared"
    w.settle()
    assert not w.nodes["node-00"].has_taint(KEYS.quarantine_taint)


def test_keys_follow_the_prefix() -> None:
    k = Keys("example.com")
    assert k.quarantine_taint == "example.com/remediation" and k.rma_label == "example.com/rma"
    assert FakeClock().now().tzinfo is not None
