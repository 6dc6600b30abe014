"""Placement summaries: usable and free GPUs, scores, and the index that follows the fleet."""

from __future__ import annotations

import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.placement.view import PlacementIndex, node_score, quality, summarize
from gpuhealth.protocol import Allocation, Condition, GpuTelemetry
from tests.support.clock import FakeClock
from tests.support.placement import alloc, gpu
from tests.support.protocol import (
    gpu_uuid,
    heartbeat,
    hello,
    snapshot,
    transition,
)

S = ExtenderSettings()


def test_time_sliced_replicas_do_not_hold_the_whole_gpu() -> None:
    shared = Allocation(
        namespace="ns", pod="p", container="c", gpu_uuid="GPU-0", device_id="GPU-0::3"
    )
    assert summarize("n", [gpu(0), gpu(1)], [shared, alloc(1)], S).free == 1


def test_summarize_counts_free_usable() -> None:
    gpus = [gpu(0), gpu(1, "degraded"), gpu(2, "unhealthy"), gpu(3, "unknown"), gpu(4)]
    s = summarize("n", gpus, [alloc(0), alloc(2)], S)
    assert (s.total, s.usable, s.free, s.degraded) == (5, 3, 2, 1)
    assert s.unusable == ("GPU-2 (xid-79)", "GPU-3 (unknown)")


@pytest.mark.parametrize(
    ("name", "usable", "degraded", "q", "want"),
    [
        ("healthy best", 8, 0, 1.0, 10),
        ("healthy worst", 8, 0, 0.0, 6),
        ("degraded best", 8, 1, 1.0, 5),
        ("degraded all", 8, 8, 1.0, 3),
        ("degraded worst", 8, 1, 0.0, 1),
        ("nothing usable", 0, 0, 1.0, 0),
    ],
)
def test_node_score(name: str, usable: int, degraded: int, q: float, want: int) -> None:
    assert node_score(usable, degraded, q) == want, name


def test_quality_terms() -> None:
    cool = [GpuTelemetry(uuid="a", temperature_c=40, slowdown_temperature_c=90, sbe_recent=0)]
    hot = [GpuTelemetry(uuid="a", temperature_c=85, slowdown_temperature_c=90, sbe_recent=40)]
    assert quality(cool, S) == pytest.approx(1.0)
    assert quality(hot, S) < 0.3
    assert quality([GpuTelemetry(uuid="a")], S) == 0.5
    busy = [GpuTelemetry(uuid="a", memory_bandwidth_ratio=0.9)]
    idle = [GpuTelemetry(uuid="a", memory_bandwidth_ratio=0.1)]
    assert quality(idle, S) > quality(busy, S)


def test_index_follows_the_fleet() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=60), clock)
    fleet.on_connect("n", hello("n", 0))
    idx = PlacementIndex(fleet)
    assert "n" not in idx.summaries  # no snapshot yet: unknown
    snap = snapshot("n", [gpu(0), gpu(1)], allocations=[alloc(0)])
    fleet.on_message("n", snap)
    assert idx.summaries["n"].free == 1
    xid = Condition(reason="XidError", code="xid-79", severity="unhealthy")
    fleet.on_message("n", transition("n", 1, "unhealthy", xid, uuid=gpu_uuid(1)))
    assert idx.summaries["n"].free == 0
    assert idx.summaries["n"].unusable == ("GPU-1 (xid-79)",)
    before = idx.summaries["n"].score
    hot = GpuTelemetry(uuid="GPU-0", temperature_c=89, slowdown_temperature_c=90, sbe_recent=50)
    fleet.on_message("n", heartbeat("n", telemetry=[hot]))
    assert idx.summaries["n"].score < before
    clock.advance(61)
    fleet.check_silent()
    assert "n" not in idx.summaries  # silent agent: unknown again
