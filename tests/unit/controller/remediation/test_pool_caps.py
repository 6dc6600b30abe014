"""The remediation caps per node pool (``safety.admission``, pure, table-driven): an episode
starts only when the fleet-wide cap and its pool's both have a free slot; a storming pool waits
within its own cap without holding the other pools back; nodes in no pool have only the
fleet-wide cap. Then the same through the runner, with two pools and one storming."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from gpuhealth.controller.remediation.model import (
    ACTIVE_PHASES,
    Episode,
    Fault,
    Phase,
    Spec,
    initial_status,
)
from gpuhealth.controller.remediation.safety import admission, pool_concurrency_limit
from gpuhealth.controller.remediation.settings import SafetySettings
from tests.fakes.remediation_world import KEYS, T0, World, fault_condition, node_facts, pod
from tests.support.remediation import one_round, runner_for, settings

SIZES = {"big": 90, "small": 10}


def pool_of(node: str) -> str:
    return node.split("-", maxsplit=1)[0] if "-" in node else ""


def ep(node: str, phase: Phase = Phase.PENDING, age: int = 0) -> Episode:
    """An episode of ``node``; a larger ``age`` is an older fault (first in the queue)."""
    detected = T0 - timedelta(seconds=age)
    fault = Fault(fingerprint=f"fp-{node}", boot_id="b", detected_at=detected, gpus=[])
    spec = Spec(node_name=node, action="reset-gpu", scope="gpu", fault=fault)
    status = initial_status(detected)
    if phase is not Phase.PENDING:
        status = type(status)(phase=phase, times=status.times)
    return Episode(name=f"{node}-ep", spec=spec, status=status)


@dataclass(frozen=True)
class Case:
    name: str
    episodes: tuple[Episode, ...]
    ask: str
    """The node whose Pending episode asks."""
    reason: str
    """"" when admitted."""
    safety: SafetySettings = field(
        default_factory=lambda: SafetySettings(max_concurrent=4, max_fraction=1.0)
    )


CASES = [
    Case(
        # small: cap min(4, floor(0.2 x 10)) = 2 with pool_max_fraction 0.2; both taken
        "a pool at its cap waits",
        (ep("small-1", Phase.DRAINING), ep("small-2", Phase.DRAINING), ep("small-3", age=9)),
        "small-3",
        "PoolConcurrencyLimit",
        SafetySettings(max_concurrent=4, max_fraction=1.0, pool_max_fraction=0.2),
    ),
    Case(
        # the older small episodes cannot start (their pool is full): they take none of the
        # fleet's slots, and the younger big one starts
        "a storming pool does not hold the other pools back",
        (
            ep("small-1", Phase.DRAINING),
            ep("small-2", Phase.DRAINING),
            ep("small-3", age=9),
            ep("small-4", age=8),
            ep("big-1", age=1),
        ),
        "big-1",
        "",
        SafetySettings(max_concurrent=4, max_fraction=1.0, pool_max_fraction=0.2),
    ),
    Case(
        # the fleet cap (4) still holds: two running, two older queued big ones take the rest
        "the fleet-wide cap still holds",
        (
            ep("small-1", Phase.DRAINING),
            ep("big-1", Phase.DRAINING),
            ep("big-2", age=9),
            ep("big-3", age=8),
            ep("small-2", age=1),
        ),
        "small-2",
        "ConcurrencyLimit",
    ),
    Case(
        "within both caps, oldest first",
        (ep("big-1", Phase.DRAINING), ep("small-1", age=2), ep("big-2", age=1)),
        "big-2",
        "",
    ),
    Case(
        # pool_max_concurrent 1: one per pool at a time, whatever the fraction
        "a pool's absolute cap",
        (ep("big-1", Phase.VALIDATING), ep("big-2", age=1)),
        "big-2",
        "PoolConcurrencyLimit",
        SafetySettings(max_concurrent=4, max_fraction=1.0, pool_max_concurrent=1),
    ),
    Case(
        # nodes in no pool: only the fleet-wide cap
        "no pool, only the fleet cap",
        (ep("n1", Phase.DRAINING), ep("n2", Phase.DRAINING), ep("n3", age=1)),
        "n3",
        "",
        SafetySettings(max_concurrent=4, max_fraction=1.0, pool_max_concurrent=1),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fleet_and_pool_caps_both_hold(case: Case) -> None:
    asking = next(e for e in case.episodes if e.node == case.ask)
    got = admission(
        asking,
        case.episodes,
        gpu_nodes=100,
        settings=settings(safety=case.safety),
        keys=KEYS,
        pool_of=pool_of,
        pool_nodes=lambda p: SIZES.get(p, 0),
    )
    assert (got.allowed, got.reason) == (case.reason == "", case.reason)
    if case.reason == "PoolConcurrencyLimit":
        assert "node pool small" in got.message or "node pool big" in got.message


@pytest.mark.parametrize(
    ("safety", "pool_nodes", "cap"),
    [
        (SafetySettings(max_concurrent=10, max_fraction=0.05), 100, 5),
        (SafetySettings(max_concurrent=10, max_fraction=0.05), 10, 1),
        (SafetySettings(max_concurrent=3, max_fraction=0.5, pool_max_concurrent=2), 100, 2),
        (SafetySettings(max_concurrent=3, max_fraction=0.05, pool_max_fraction=0.5), 4, 2),
    ],
)
def test_a_pools_cap(safety: SafetySettings, pool_nodes: int, cap: int) -> None:
    assert pool_concurrency_limit(pool_nodes, settings(safety=safety)) == cap


XID48 = fault_condition("xid-48", "RESET_GPU")


async def test_two_pools_one_storming_through_the_runner() -> None:
    """Six faulty nodes of a 10-node pool storm, one node of a 10-node pool fails later: the
    storming pool runs at most its cap (1) at a time, the other pool's episode is not queued
    behind it."""
    w = World()
    for pool, faulty in (("small", 6), ("other", 1)):
        for i in range(10):
            name = f"{pool}-{i}"
            since = T0 + timedelta(seconds=60 if pool == "other" else i)
            w.nodes[name] = node_facts(
                name,
                unhealthy={0: fault_condition("xid-48", "RESET_GPU", since=since)}
                if i < faulty
                else None,
                allocations=None,
                labels={"karpenter.sh/nodepool": pool},
            )
            w.add(pod(f"p-{name}", name))
    cfg = settings(safety=SafetySettings(max_concurrent=4, max_fraction=1.0, pool_max_fraction=0.1))
    r = runner_for(w, cfg)
    most_small = 0
    other_started = False
    for _ in range(8):
        await one_round(w, r)
        active = [e for e in w.store.episodes() if e.phase in ACTIVE_PHASES]
        most_small = max(most_small, sum(1 for e in active if e.node.startswith("small-")))
        other_started |= any(
            e.node == "other-0" and e.phase is not Phase.PENDING for e in w.store.episodes()
        )
        w.advance(1)
    assert most_small == 1
    assert other_started
    waiting = {e.status.reason for e in w.store.episodes() if e.phase is Phase.PENDING}
    assert waiting == {"PoolConcurrencyLimit"}
