"""A stream's profile (bench.stream_profile) and the fleet benchmark's simulated agents'
messages (bench.fleet_scale_agents.NodeGpus), without processes: the integration test
``test_bench_stream_shape`` holds the simulated agent to a recording of the real one."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from bench.fleet_scale_agents import GPUS, NodeGpus, busy_pod
from bench.stream_profile import Frame, StreamProfile, differences, profile
from gpuhealth.protocol import Hello, encode
from gpuhealth.protocol.codec import decode_agent

NODE = "gpu-node-00042"


def _frames(
    gpus: NodeGpus, shape: str = "real", beats: int = 6, gap_s: float = 10.0
) -> list[Frame]:
    """An agent's first connection as the simulated agents send it, then ``beats``
    Heartbeats every ``gap_s``."""
    assert shape in ("real", "fixed")
    hello = Hello(seq=1, node=NODE, stream_id="s", boot_id="b", agent_version="v", gpus=gpus.infos)
    out = [Frame(0.0, encode(hello))]
    events = gpus.started(1, NODE) if shape == "real" else []
    out += [Frame(0.001, encode(e)) for e in events]
    out.append(Frame(0.002, encode(gpus.snapshot(shape, len(events) + 1, NODE))))  # type: ignore[arg-type]
    for k in range(beats):
        seq = len(events) + 2 + k
        out.append(Frame(5.0 + k * gap_s, encode(gpus.heartbeat(shape, seq, NODE))))  # type: ignore[arg-type]
    return out


@pytest.fixture
def gpus() -> NodeGpus:
    return NodeGpus(42, NODE, samples=10)


def test_the_profile_of_a_busy_agent(gpus: NodeGpus) -> None:
    p = profile(_frames(gpus))
    assert p.opening == ("hello", *["event"] * GPUS, "snapshot")
    assert p.steady == {"heartbeat": 6}
    assert p.types["heartbeat"].count == 6
    assert p.types["heartbeat"].interval_s == pytest.approx(10.0)
    assert p.types["heartbeat"].per_minute == pytest.approx(60 * 6 / 55.0)
    assert p.telemetry_per_heartbeat == p.usage_per_heartbeat == GPUS
    assert p.changing() == {
        "at",
        "telemetry.temperature_c",
        "telemetry.power_w",
        "telemetry.utilization_ratio",
        "telemetry.memory_bandwidth_ratio",
        "usage.utilization_ratio",
    }
    assert p.changed["telemetry.slowdown_temperature_c"] == 0.0
    lo, median, hi = p.ranges["temperature_c"]
    assert 45.0 <= lo <= median <= hi <= 70.0


def test_the_fixed_shape_changes_nothing_and_reports_no_usage(gpus: NodeGpus) -> None:
    p = profile(_frames(gpus, "fixed"))
    assert p.opening == ("hello", "snapshot")
    assert p.changing() == frozenset()
    assert p.usage_per_heartbeat == 0


def test_a_profile_needs_frames() -> None:
    with pytest.raises(ValueError, match="no frames"):
        profile([])


def _changed(p: StreamProfile, **kw: object) -> StreamProfile:
    return dataclasses.replace(p, **kw)  # type: ignore[arg-type]


def _bigger_heartbeats(
    p: StreamProfile, factor: float, what: str = "bytes_median"
) -> StreamProfile:
    beat = p.types["heartbeat"]
    scaled = dataclasses.replace(
        beat, **{what: type(getattr(beat, what))(getattr(beat, what) * factor)}
    )
    return _changed(p, types={**p.types, "heartbeat": scaled})


def _slower(p: StreamProfile, factor: float) -> StreamProfile:
    beat = p.types["heartbeat"]
    assert beat.interval_s is not None
    return _changed(
        p,
        types={
            **p.types,
            "heartbeat": dataclasses.replace(beat, interval_s=beat.interval_s * factor),
        },
    )


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (lambda p: p, None),
        (lambda p: _bigger_heartbeats(p, 1.15), None),
        (lambda p: _bigger_heartbeats(p, 0.85, "bytes_max"), None),
        (lambda p: _bigger_heartbeats(p, 1.3), "heartbeat size"),
        (lambda p: _bigger_heartbeats(p, 0.7, "bytes_max"), "largest heartbeat"),
        (lambda p: _slower(p, 1.5), "heartbeat interval"),
        (lambda p: _changed(p, steady={"heartbeat": 6, "snapshot": 1}), "steady message types"),
        (lambda p: _changed(p, opening=("hello", "snapshot")), "opening"),
        (lambda p: _changed(p, opening=(*p.opening, "snapshot")), None),
        (lambda p: _changed(p, usage_per_heartbeat=0), "usage_per_heartbeat"),
        (lambda p: _changed(p, changed={**p.changed, "at": 0.0}), "changing heartbeat fields"),
        (lambda p: _changed(p, changed={**p.changed, "usage.samples": 0.2}), None),
        (
            lambda p: _changed(p, ranges={**p.ranges, "power_w": (100.0, 120.0, 140.0)}),
            "power_w",
        ),
    ],
)
def test_differences_name_what_the_simulated_agent_gets_wrong(
    gpus: NodeGpus, change: object, found: str | None
) -> None:
    """The real agent's profile against a simulated one changed in one respect: within the
    tolerance nothing is reported, past it that respect is named (a run of Snapshots in the
    opening counts as one; a field changing in a fifth of the pairs does not change)."""
    real = profile(_frames(gpus))
    sim = change(real)  # type: ignore[operator]
    got = differences(real, sim)
    if found is None:
        assert got == []
    else:
        assert len(got) == 1 and found in got[0], got


def test_the_fixed_shape_is_told_apart_from_a_busy_agent(gpus: NodeGpus) -> None:
    got = differences(profile(_frames(gpus)), profile(_frames(gpus, "fixed")))
    joined = "\n".join(got)
    for what in ("opening", "heartbeat size", "changing heartbeat fields", "usage_per_heartbeat"):
        assert what in joined, got


def test_every_heartbeat_drifts_within_an_h100s_ranges(gpus: NodeGpus) -> None:
    """Consecutive real-shape Heartbeats differ in every GPU's temperature, power and
    utilisation (rounded as the simulated GPU source rounds), and carry the busy pod's use of
    every GPU; the fixed shape sends the very same telemetry every time, no usage, a fixed
    time."""
    a, b = gpus.heartbeat("real", 1, NODE), gpus.heartbeat("real", 2, NODE)
    assert abs(b.at - a.at) < timedelta(seconds=5) and a.at.tzinfo is UTC
    assert b.at <= datetime.now(UTC)
    for t, u in zip(a.telemetry, b.telemetry, strict=True):
        assert t.uuid == u.uuid
        assert (t.power_w, t.utilization_ratio) != (u.power_w, u.utilization_ratio)
        assert t.temperature_c is not None and 40.0 <= t.temperature_c <= 70.0
        assert t.power_w is not None and 300.0 <= t.power_w <= 700.0
        assert t.temperature_c == round(t.temperature_c, 1)
        assert t.utilization_ratio == round(t.utilization_ratio or 0.0, 3)
    namespace, pod, container = busy_pod(NODE)
    assert [(x.namespace, x.pod, x.container, x.gpu_uuid) for x in a.usage] == [
        (namespace, pod, container, i.uuid) for i in gpus.infos
    ]
    assert {x.samples for x in a.usage} == {10}
    fixed = gpus.heartbeat("fixed", 3, NODE), gpus.heartbeat("fixed", 4, NODE)
    assert fixed[0].telemetry is fixed[1].telemetry and fixed[0].at == fixed[1].at
    assert fixed[0].usage == []


def test_the_snapshot_and_start_up_events_as_the_real_agent_sends_them(gpus: NodeGpus) -> None:
    """Every GPU healthy with the simulated source's identity; in the real shape the busy pod
    holds every GPU by UUID (the device plugin's IDs); the agent's start: each GPU from
    unknown to healthy, numbered from the first sequence number on."""
    snap = gpus.snapshot("real", 9, NODE)
    assert [s.info.uuid for s in snap.gpus] == [i.uuid for i in gpus.infos]
    assert all(i.uuid.startswith("GPU-") and len(i.uuid) == 40 for i in gpus.infos)
    assert all(i.serial and i.pci_bus_id and i.memory_total_bytes for i in gpus.infos)
    assert [(a.gpu_uuid, a.device_id) for a in snap.allocations] == [
        (i.uuid, i.uuid) for i in gpus.infos
    ]
    assert gpus.snapshot("fixed", 10, NODE).allocations == []
    events = gpus.started(5, NODE)
    assert [(e.seq, e.gpu_index, e.previous, e.current) for e in events] == [
        (5 + k, k, "unknown", "healthy") for k in range(GPUS)
    ]
    assert decode_agent(encode(snap)) == snap


def test_each_node_has_its_own_gpus() -> None:
    a, b = NodeGpus(1, "gpu-node-00001"), NodeGpus(2, "gpu-node-00002")
    assert not {i.uuid for i in a.infos} & {i.uuid for i in b.infos}
    assert [i.uuid for i in NodeGpus(1, "gpu-node-00001").infos] == [i.uuid for i in a.infos]
