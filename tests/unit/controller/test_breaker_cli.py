"""``gpuhealth-controller breaker status``: the breaker document in one line, then a line per node
pool with a breaker of its own."""

from __future__ import annotations

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker_cli import describe
from gpuhealth.controller.http.api import breaker_json
from tests.support.clock import FakeClock


def test_the_status_names_each_pool_and_its_budget() -> None:
    b = CircuitBreaker(BreakerSettings(max_fraction=0.1), FakeClock())
    b.request("big-1", 100, pool="big", pool_nodes=90)
    b.request("small-1", 100, pool="small", pool_nodes=10)
    b.request("small-2", 100, pool="small", pool_nodes=10)  # trips the small pool
    text = describe(breaker_json(b.status()))
    lines = text.splitlines()
    assert lines[0].startswith("circuit breaker closed: 2 of 10 new node taints")
    assert lines[1:3] == ["  pool big: closed, 1 of 9", "  pool small: OPEN, 1 of 1"]
    assert lines[3] == "blocked nodes: small-2"
