"""The one hard-write gate: one breaker budget for every kind, leadership, trips and resets."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.breaker import CircuitBreaker
from gpuhealth.controller.hard_writes import (
    HARD_WRITE_KINDS,
    GateMetrics,
    HardWrite,
    HardWriteGate,
    HardWriteKind,
    WriteGate,
)
from gpuhealth.controller.remediation.safety import HardWriteGate as RemediationGate
from gpuhealth.controller.settings import BreakerSettings
from tests.support.clock import FakeClock


def gate(
    *, limit: int = 1, leading: bool = True, gpu_nodes: int = 10
) -> tuple[WriteGate, GateMetrics]:
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=limit), FakeClock())
    metrics = GateMetrics(CollectorRegistry())
    return WriteGate(
        breaker, gpu_nodes=lambda: gpu_nodes, leading=lambda: leading, metrics=metrics
    ), metrics


@pytest.mark.parametrize("second", HARD_WRITE_KINDS)
@pytest.mark.parametrize("first", HARD_WRITE_KINDS)
def test_every_kind_shares_one_budget_per_node(first: HardWriteKind, second: HardWriteKind) -> None:
    g, _ = gate(limit=1)
    assert g.request(HardWrite("a", first)).allowed
    assert g.request(HardWrite("a", second)).allowed  # the same node counts once
    refused = g.request(HardWrite("b", second))
    assert not refused.allowed and refused.tripped and refused.reason == "BreakerOpen"
    assert g.request(HardWrite("a", first)).allowed  # admitted in the window: whole verdict
    again = g.request(HardWrite("c", first))
    assert not again.allowed and not again.tripped


def test_a_replica_that_does_not_lead_is_refused_without_touching_the_breaker() -> None:
    g, metrics = gate(leading=False)
    d = g.request(HardWrite("a", "device-taint"))
    assert (d.allowed, d.reason) == (False, "NotLeader")
    assert g.breaker.status().recent_nodes == 0 and not g.breaker.is_open
    assert metrics.decisions.labels("device-taint", "not_leader")._value.get() == 1


def test_a_trip_is_counted_once_and_told_to_every_subscriber() -> None:
    g, metrics = gate(limit=1)
    heard: list[tuple[str, str]] = []

    def broken(_w: HardWrite, _s: str) -> None:
        raise RuntimeError("a broken listener must not stop the others")

    g.subscribe(on_trip=broken)
    g.subscribe(on_trip=lambda w, s: heard.append((w.node, w.kind)))
    g.request(HardWrite("a", "node-taint"))
    g.request(HardWrite("b", "device-taint"))
    g.request(HardWrite("c", "evict", episode="c-123"))
    assert heard == [("b", "device-taint")]
    assert metrics.trips._value.get() == 1
    assert metrics.decisions.labels("device-taint", "blocked")._value.get() == 1
    assert metrics.decisions.labels("evict", "blocked")._value.get() == 1


def test_a_reset_closes_the_breaker_and_hands_the_blocked_nodes_to_subscribers() -> None:
    g, _ = gate(limit=1)
    got: list[list[str]] = []
    g.subscribe(on_reset=got.append)
    g.request(HardWrite("a", "node-taint"))
    g.request(HardWrite("b", "device-taint"))
    g.request(HardWrite("c", "node-noexecute"))
    assert g.reset(by="system:serviceaccount:ops:oncall") == ["b", "c"]
    assert got == [["b", "c"]]
    assert not g.breaker.is_open
    assert g.request(HardWrite("b", "device-taint")).allowed


def test_the_gate_is_what_the_remediation_loop_asks() -> None:
    g, _ = gate()
    as_protocol: HardWriteGate = g
    as_remediation: RemediationGate = g
    assert as_protocol.request(HardWrite("n", "reboot", episode="e")).allowed
    assert as_remediation is as_protocol
