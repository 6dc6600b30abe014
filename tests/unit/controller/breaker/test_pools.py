"""Budgets per node pool: a hard write passes only when the fleet-wide budget and its pool's both
have room; a pool that runs out opens only its own breaker; nodes in no pool have only the
fleet's. Table-driven over sequences of requests from two pools, one storming; then the
group (an NVLink domain across pools), the gate's message and metric, and the stored state."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.breaker.gate import (
    CircuitBreaker,
    GateMetrics,
    GateVerdict,
    HardWrite,
    PoolTrip,
    WriteGate,
)
from gpuhealth.controller.breaker.settings import BreakerSettings, PoolBudget
from gpuhealth.controller.breaker.store import (
    MAX_OPEN_POOLS,
    OpenPool,
    StoredBreaker,
    WindowEntry,
    configmap_data,
    stored_from_data,
)
from gpuhealth.controller.breaker.sync import BreakerSync, stored_state
from tests.support.clock import FakeClock

A, T, F = GateVerdict.ALLOW, GateVerdict.TRIP, GateVerdict.BLOCK

SIZES = {"big": 90, "small": 10, "": 0}
"""GPU nodes per pool; the fleet has 100."""


def pool_of(node: str) -> str:
    return node.split("-", maxsplit=1)[0] if "-" in node else ""


@dataclass(frozen=True)
class Case:
    name: str
    requests: tuple[str, ...]
    verdicts: tuple[GateVerdict, ...]
    open_pools: tuple[str, ...] = ()
    fleet_open: bool = False
    settings: BreakerSettings = field(default_factory=lambda: BreakerSettings(max_fraction=0.1))


CASES = [
    Case(
        # 10% of 10 = 1 for the small pool: its second node trips the pool, not the fleet;
        # the big pool goes on (its own 9, within the fleet's 10)
        "small pool storms, the big pool goes on",
        ("small-1", "small-2", "small-3", "big-1", "big-2", "small-1"),
        (A, T, F, A, A, A),
        open_pools=("small",),
    ),
    Case(
        # the big pool spends its own 9 and no more: the fleet's tenth is left for the small pool
        "big pool storms, cannot spend the fleet's budget beyond its own",
        (*(f"big-{i}" for i in range(11)), "small-1"),
        (A,) * 9 + (T, F, A),
        open_pools=("big",),
    ),
    Case(
        # a large pool cannot hide a small pool's storm: 2 of 10 small nodes trip the small
        # pool although the fleet (2 of 100) has plenty of room
        "a large fleet does not hide a small pool's storm",
        ("small-1", "big-1", "small-2"),
        (A, A, T),
        open_pools=("small",),
    ),
    Case(
        # both pools within their own budgets until the fleet's (10) runs out: the fleet opens
        "the fleet-wide budget still holds",
        (*(f"big-{i}" for i in range(9)), "small-1", "small-2", "big-9"),
        (A,) * 10 + (T, F),
        fleet_open=True,
        settings=BreakerSettings(max_fraction=0.1, pools={"small": PoolBudget(max_fraction=0.5)}),
    ),
    Case(
        "nodes in no pool have only the fleet-wide budget",
        tuple(f"n{i}" for i in range(11)),
        (A,) * 10 + (T,),
        fleet_open=True,
    ),
    Case(
        "per_pool off: only the fleet-wide budget",
        ("small-1", "small-2", "small-3"),
        (A, A, A),
        settings=BreakerSettings(max_fraction=0.1, per_pool=False),
    ),
    Case(
        "a pool's own minimum",
        ("small-1", "small-2", "small-3", "small-4"),
        (A, A, A, T),
        open_pools=("small",),
        settings=BreakerSettings(max_fraction=0.1, pools={"small": PoolBudget(min_nodes=3)}),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fleet_and_pool_budgets_both_hold(case: Case) -> None:
    b = CircuitBreaker(case.settings, FakeClock())
    got = tuple(
        b.request(n, 100, pool=pool_of(n), pool_nodes=SIZES[pool_of(n)]) for n in case.requests
    )
    assert got == case.verdicts
    assert tuple(sorted(b.open_pools)) == case.open_pools
    assert b.is_open == case.fleet_open
    st = b.status()
    assert st.open_pools == case.open_pools and st.open == case.fleet_open


def test_a_pool_trip_is_reset_with_the_fleet_and_the_window_counts_per_pool() -> None:
    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1, window_s=60), clock)
    assert b.request("small-1", 100, pool="small", pool_nodes=10) is A
    assert b.request("small-2", 100, pool="small", pool_nodes=10) is T
    assert b.last_trip_pool == "small" and not b.is_open and b.any_open
    assert b.request("small-3", 100, pool="small", pool_nodes=10) is F
    assert b.reset() == ["small-2", "small-3"]
    assert not b.any_open
    assert b.request("small-2", 100, pool="small", pool_nodes=10) is A
    clock.advance(61)  # the window slides out: the pool has room again
    assert b.status().pools == ()
    assert b.request("small-3", 100, pool="small", pool_nodes=10) is A


def test_past_the_open_pools_the_store_holds_the_fleet_opens() -> None:
    b = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=0), FakeClock())
    for i in range(MAX_OPEN_POOLS):
        assert b.request(f"p{i}-n", 100, pool=f"p{i}", pool_nodes=1) is T
    assert len(b.open_pools) == MAX_OPEN_POOLS and not b.is_open
    assert b.request("last-n", 100, pool="last", pool_nodes=1) is T
    assert b.is_open and b.last_trip_pool is None


@pytest.mark.parametrize(
    ("nodes", "verdict", "open_pools", "admitted"),
    [
        # one from each pool: both pools and the fleet have room
        (("small-1", "big-1"), A, (), 2),
        # two from the small pool: the small pool has no room; the whole group waits,
        # only the small pool opens
        (("small-1", "small-2", "big-1"), T, ("small",), 0),
    ],
)
def test_a_group_across_pools_is_admitted_whole_or_not_at_all(
    nodes: tuple[str, ...], verdict: GateVerdict, open_pools: tuple[str, ...], admitted: int
) -> None:
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1), FakeClock())
    got = b.request_group(nodes, 100, pool_of=pool_of, pool_nodes=SIZES.get)
    assert got is verdict
    assert tuple(sorted(b.open_pools)) == open_pools and not b.is_open
    assert b.status().recent_nodes == admitted
    if verdict is not A:
        assert set(b.status().blocked_nodes) == set(nodes)


def test_a_group_with_a_member_in_an_open_pool_waits_with_it() -> None:
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1), FakeClock())
    b.request("small-1", 100, pool="small", pool_nodes=10)
    b.request("small-2", 100, pool="small", pool_nodes=10)  # trips the small pool
    assert b.request_group(("big-1", "small-3"), 100, pool_of=pool_of, pool_nodes=SIZES.get) is F
    assert b.status().recent_nodes == 1


def test_the_gate_names_the_pool_and_counts_its_trip() -> None:
    registry = CollectorRegistry()
    sizes = {"small": 10, "big": 90}
    gate = WriteGate(
        CircuitBreaker(BreakerSettings(max_fraction=0.1), FakeClock()),
        gpu_nodes=lambda: 100,
        metrics=GateMetrics(registry),
        pool_of=pool_of,
        pool_nodes=lambda p: sizes.get(p, 0),
    )
    sentences: list[str] = []
    gate.subscribe(on_trip=lambda _w, s: sentences.append(s))
    assert gate.request(HardWrite("small-1", "quarantine")).allowed
    refused = gate.request(HardWrite("small-2", "replace-node"))
    assert not refused.allowed and refused.tripped and refused.reason == "BreakerOpen"
    assert "node pool small" in refused.message
    assert "node pool small" in sentences[0] and "10 GPU nodes" in sentences[0]
    assert gate.request(HardWrite("big-1", "node-taint")).allowed
    assert (
        registry.get_sample_value("gpuhealth_circuit_breaker_pool_trips_total", {"pool": "small"})
        == 1
    )
    assert registry.get_sample_value("gpuhealth_circuit_breaker_trips_total") == 0
    assert gate.reset(by="test") == ["small-2"]


def test_the_stored_state_keeps_pools_and_an_operators_close_closes_them() -> None:
    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1), clock)
    b.request("small-1", 100, pool="small", pool_nodes=10)
    b.request("small-2", 100, pool="small", pool_nodes=10)
    b.request("big-1", 100, pool="big", pool_nodes=90)
    data = configmap_data(stored_state(b))
    assert (data["state"], data["fleet"]) == ("open", "closed")
    back = stored_from_data(dict(data))
    assert not back.open and [p.pool for p in back.pools] == ["small"]
    assert {(e.node, e.pool) for e in back.window} == {("small-1", "small"), ("big-1", "big")}
    # an operator's `state: closed` closes the fleet and every pool
    assert not stored_from_data({**data, "state": "closed"}).any_open
    # a ConfigMap written before pools: state open is the fleet open
    old = stored_from_data({"state": "open", "trips": "2", "window": "[]"})
    assert old.open and old.pools == ()
    # damaged pools never loosen: the fleet reads open
    assert stored_from_data({**data, "pools": "{not json"}).open


class Store:
    def __init__(self, state: StoredBreaker | None) -> None:
        self.state = state

    async def load(self) -> StoredBreaker | None:
        return self.state

    async def save(self, state: StoredBreaker) -> None:
        self.state = state


class Owner:
    def reset(self, *, by: str) -> list[str]:
        return []


async def test_a_new_leader_keeps_the_pools_and_their_windows() -> None:
    clock = FakeClock()
    at = clock.now().isoformat()
    stored = StoredBreaker(
        open=False,
        pools=(OpenPool(pool="small", tripped_at=at, trips=1),),
        window=(WindowEntry(node="big-1", at=at, pool="big"),),
    )
    b = CircuitBreaker(BreakerSettings(max_fraction=0.01), clock)  # big: 1 of 90
    sync = BreakerSync(b, Store(stored), Owner(), clock)
    await sync.adopt()
    assert b.open_pools == {"small": PoolTrip(clock.now(), 1)} and not b.is_open
    assert b.request("small-3", 100, pool="small", pool_nodes=10) is F
    assert b.request("big-2", 100, pool="big", pool_nodes=90) is T  # big-1 still counts
