"""Circuit breaker: limit, window, trip, reset; driven by a FakeClock."""

from __future__ import annotations

import pytest

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateVerdict
from gpuhealth.controller.breaker.settings import BreakerSettings
from tests.support.clock import FakeClock


def make(**kw: object) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(BreakerSettings(**kw), clock), clock  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fraction", "min_nodes", "fleet", "limit"),
    [(0.1, 1, 100, 10), (0.1, 1, 5, 1), (0.1, 3, 5, 3), (0.5, 1, 7, 3), (0.0, 0, 10, 0)],
)
def test_limit(fraction: float, min_nodes: int, fleet: int, limit: int) -> None:
    b, _ = make(max_fraction=fraction, min_nodes=min_nodes)
    assert b.limit(fleet) == limit


@pytest.mark.parametrize(
    ("fraction", "part", "shard_nodes", "limit"),
    [
        (0.0, 3, 50, 3),  # a shard owner's part of min_nodes (say 12 over 4 even shards)
        (0.0, 0, 50, 0),  # a shard without GPU nodes gets no part
        (0.1, 2, 50, 5),  # the fraction applies to the owner's own GPU nodes as it is
        (0.1, 9, 50, 9),
    ],
)
def test_a_shard_owners_floor_is_its_part(
    fraction: float, part: int, shard_nodes: int, limit: int
) -> None:
    """Past one process ``min_nodes`` is fleet-wide: each owner's breaker takes its part,
    asked at each decision (the sizes change), instead of the setting."""
    parts = [part]
    b = CircuitBreaker(
        BreakerSettings(max_fraction=fraction, min_nodes=12),
        FakeClock(),
        min_nodes=lambda: parts[0],
    )
    assert b.limit(shard_nodes) == limit
    parts[0] = 12
    assert b.limit(shard_nodes) == max(12, int(fraction * shard_nodes))


def test_trips_exactly_past_the_limit() -> None:
    b, _ = make(max_fraction=0.1)
    verdicts = [b.request(f"n{i}", 20) for i in range(5)]
    assert verdicts == [
        GateVerdict.ALLOW,
        GateVerdict.ALLOW,
        GateVerdict.TRIP,
        GateVerdict.BLOCK,
        GateVerdict.BLOCK,
    ]
    st = b.status()
    assert st.open and st.trips == 1 and st.recent_nodes == 2 and st.limit == 2
    assert st.blocked_nodes == ("n2", "n3", "n4")


def test_same_node_counts_once() -> None:
    b, _ = make(max_fraction=0.1)
    assert all(b.request("n1", 10) is GateVerdict.ALLOW for _ in range(5))
    assert b.request("n2", 10) is GateVerdict.TRIP


def test_window_slides() -> None:
    b, clock = make(max_fraction=0.1, window_s=60)
    assert b.request("a", 10) is GateVerdict.ALLOW
    clock.advance(61)
    assert b.request("b", 10) is GateVerdict.ALLOW
    assert b.status().recent_nodes == 1


def test_stays_open_until_reset_then_counts_afresh() -> None:
    b, clock = make(max_fraction=0.1, window_s=60)
    b.request("a", 10)
    assert b.request("b", 10) is GateVerdict.TRIP
    clock.advance(3600)
    assert b.request("c", 10) is GateVerdict.BLOCK
    assert b.reset() == ["b", "c"]
    assert not b.is_open
    assert b.request("b", 10) is GateVerdict.ALLOW
    assert b.request("c", 10) is GateVerdict.TRIP
    assert b.trips == 2


def test_disabled_never_blocks() -> None:
    b, _ = make(enabled=False)
    assert all(b.request(f"n{i}", 10) is GateVerdict.ALLOW for i in range(100))
    assert not b.is_open


def test_storm_of_half_the_fleet() -> None:
    b, _ = make()
    allowed = [i for i in range(100) if b.request(f"n{i}", 200) is GateVerdict.ALLOW]
    assert len(allowed) == 20
    assert b.is_open
