"""The status page over a real Fleet, breaker and idle tracker: what it reports and logs, and
how often it rebuilds the overview."""

from __future__ import annotations

from typing import Any

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.idle import IdleSettings
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.controller.status_page.page import StatusPage
from gpuhealth.protocol import AllocationUsage
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.protocol import XID79, gpu_uuid


async def test_page_reports_breaker_and_idle_and_logs_their_changes() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=1), clock)
    idle = IdleTracker(IdleSettings(window_s=10, evaluate_interval_s=1), clock=clock)
    idle.attach(fleet)
    page = StatusPage(fleet=fleet, breaker=breaker, idle=idle, clock=clock)
    connect(fleet, "n0", 8)

    def heartbeat() -> None:
        usage = AllocationUsage(
            namespace="ml", pod="nb", container="main", gpu_uuid=gpu_uuid(6, "n0"),
            utilization_ratio=0.0,
        )  # fmt: skip
        idle.observe("n0", [usage], {gpu_uuid(6, "n0"): "6"})

    heartbeat()
    for _ in range(3):
        clock.advance(6)
        heartbeat()
    idle.evaluate()
    breaker.request("n0", 8)
    breaker.request("n1", 8)  # over the limit of 1: trips

    doc: dict[str, Any] = page.overview()

    assert doc["breaker"]["open"] is True and doc["breaker"]["blocked_nodes"] == ["n1"]
    assert [(a["pod"], a["gpu"]) for a in doc["idle"]] == [("nb", "6")]
    assert doc["summary"]["idle_allocations"] == 1
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds[:2] == ["idle", "breaker"]
    page.overview()
    assert [e["kind"] for e in page.overview()["events"]].count("idle") == 1  # logged once


def test_overview_is_built_at_most_once_per_cache_period() -> None:
    import json

    clock = FakeClock()
    fleet = Fleet(clock=clock)
    page = StatusPage(fleet=fleet, clock=clock, cache_s=1.0)
    connect(fleet, "n0", 8)
    first = page.overview_json()
    send_transition(fleet, "n0", 3, "unhealthy", XID79)
    assert page.overview_json() is first  # shared by every page polling within the period
    clock.advance(1.0)
    doc = json.loads(page.overview_json())
    assert doc["nodes"][0]["gpus"][3]["state"] == "unhealthy"
