"""The breaker's room as a drain sees it (``facts.BreakerRoom``, pure; read by
``assembly.GateRoom`` without asking the gate): the fleet's room and each node pool's, so a
gang that would overrun either waits before its first eviction instead of tripping a breaker."""

from __future__ import annotations

import pytest

from gpuhealth.controller.breaker.gate import CircuitBreaker, WriteGate
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.remediation.assembly import GateRoom
from gpuhealth.controller.remediation.facts import BreakerRoom
from tests.support.clock import FakeClock

POOLS = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "x": ""}


@pytest.mark.parametrize(
    ("room", "nodes", "fits", "short"),
    [
        (BreakerRoom(), {"a1", "a2", "b1"}, True, {}),  # the breaker off
        (BreakerRoom(free=3), {"a1", "a2", "b1"}, True, {}),  # no pools known: the fleet's
        (BreakerRoom(free=2), {"a1", "a2", "b1"}, False, {}),  # the fleet's room short
        (
            BreakerRoom(free=10, pool_of=POOLS, pool_free={"a": 1, "b": 2}),
            {"a1", "a2", "b1"},
            False,
            {"a": 1},
        ),
        (
            BreakerRoom(free=10, pool_of=POOLS, pool_free={"a": 2, "b": 0}),
            {"a1", "a2", "b1"},
            False,
            {"b": 0},
        ),
        (  # admitted nodes cost nothing, in the fleet's budget or their pool's
            BreakerRoom(
                admitted=frozenset({"a1"}), free=2, pool_of=POOLS, pool_free={"a": 1, "b": 1}
            ),
            {"a1", "a2", "b1"},
            True,
            {},
        ),
        (  # a node in no pool (or an open pool: not listed) counts against the fleet only
            BreakerRoom(free=1, pool_of={"a1": "a"}, pool_free={"a": 0}),
            {"x"},
            True,
            {},
        ),
    ],
)
def test_room_of_the_fleet_and_of_each_pool(
    room: BreakerRoom, nodes: set[str], fits: bool, short: dict[str, int]
) -> None:
    assert room.fits(nodes) is fits
    assert room.short_pools(nodes) == short


def test_the_gate_room_reads_each_pools_budget_without_counting() -> None:
    """Pool a: 10 GPU nodes at max_fraction 0.2 (budget 2), one admitted; pool b: open; the
    fleet: 100 nodes (budget 20). Reading the room admits nothing."""
    clock = FakeClock()
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.2, min_nodes=1), clock)
    sizes = {"a": 10, "b": 10}
    gate = WriteGate(
        breaker,
        gpu_nodes=lambda: 100,
        pool_of=lambda n: POOLS.get(n, ""),
        pool_nodes=lambda p: sizes.get(p, 0),
    )
    assert breaker.request("a1", 100, pool="a", pool_nodes=10).name == "ALLOW"
    for n in ("b1", "b2", "b3"):  # pool b's budget is 2: the third opens it
        breaker.request(n, 100, pool="b", pool_nodes=10)
    assert "b" in breaker.open_pools
    version = breaker.version
    room = GateRoom(gate).room({"a1", "a2", "a3", "b1", "x"})
    assert breaker.version == version  # nothing counted
    assert room.free == 20 - 3 and room.pool_free == {"a": 1}
    assert dict(room.pool_of) == {"a1": "a", "a2": "a", "a3": "a"}  # b: open, x: no pool
    assert room.short_pools({"a1", "a2", "a3"}) == {"a": 1}
    assert room.fits({"a1", "a2"}) and not room.fits({"a2", "a3"})
