"""The engine and the fabric: not-ready after the grace period, degraded by its health mask,
membership changes send a Snapshot, and fatal NVSwitch errors are a node condition."""

from __future__ import annotations

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.engine import NONFATAL_SXIDS
from gpuhealth.agent.observations import (
    FabricInfo,
    GpuIdentity,
    GpuSample,
    Inventory,
    ResetObservation,
    SxidObservation,
)
from tests.support.clock import FakeClock

U = "GPU-0"
DONE = FabricInfo(state="completed", cluster_uuid="c1", clique_id=3)


def engine(**kw: object) -> tuple[HealthEngine, FakeClock]:
    clock = FakeClock()
    e = HealthEngine(HealthSettings(**kw), clock)  # type: ignore[arg-type]
    ident = GpuIdentity(index=0, uuid=U, model="GB200", pci_bus_id="00000000:01:00.0")
    e.observe(Inventory(source="sim", gpus=(ident,)))
    return e, clock


def feed(e: HealthEngine, clock: FakeClock, fabric: FabricInfo | None, seconds: int) -> None:
    for _ in range(seconds):
        e.observe(GpuSample(uuid=U, at=clock.now(), fabric=fabric))
        clock.advance(1.0)


def codes(e: HealthEngine) -> set[str]:
    return {c.code for s in e.statuses() for c in s.conditions}


def test_registration_in_progress_is_fine_within_the_grace_period() -> None:
    e, clock = engine(fabric_not_ready_s=60.0)
    feed(e, clock, FabricInfo(state="in-progress"), 30)
    assert codes(e) == set()
    feed(e, clock, DONE, 5)
    assert codes(e) == set()


def test_registration_stuck_past_the_grace_period_is_unhealthy_then_clears() -> None:
    e, clock = engine(fabric_not_ready_s=60.0, clean_window_s=10.0)
    feed(e, clock, FabricInfo(state="not-started"), 70)
    (st,) = e.statuses()
    assert st.state == "unhealthy" and codes(e) == {"fabric-not-ready"}
    feed(e, clock, DONE, 20)
    assert codes(e) == set()


def test_a_failed_registration_is_unhealthy() -> None:
    e, clock = engine(fabric_not_ready_s=5.0)
    feed(e, clock, FabricInfo(state="completed", cluster_uuid="c1", status=3), 10)
    (cond,) = e.statuses()[0].conditions
    assert cond.code == "fabric-not-ready" and "status 3" in cond.message


def test_no_fabric_is_never_judged() -> None:
    e, clock = engine(fabric_not_ready_s=1.0)
    feed(e, clock, None, 10)
    assert codes(e) == set() and e.statuses()[0].fabric is None


def test_a_membership_change_sends_a_snapshot_and_is_reported() -> None:
    e, clock = engine()
    before = e.devices_version
    feed(e, clock, FabricInfo(state="in-progress"), 1)
    feed(e, clock, DONE, 3)
    assert e.devices_version == before + 2  # none -> in-progress -> completed, then steady
    fabric = e.statuses()[0].fabric
    assert fabric is not None and fabric.domain == "c1.3"


def test_a_fatal_sxid_is_a_latched_node_condition_a_nonfatal_one_is_counted() -> None:
    e, clock = engine()
    v0 = e.node_version
    e.observe(SxidObservation(source="kmsg", sxid=20009, at=clock.now(), fatal=False))
    assert e.node_conditions() == [] and e.counters.value(NONFATAL_SXIDS) == 1
    first = clock.now()
    e.observe(
        SxidObservation(
            source="kmsg", sxid=24007, at=first, fatal=True, switch=3, link=28, message="x"
        )
    )
    clock.advance(5)
    e.observe(SxidObservation(source="kmsg", sxid=20034, at=clock.now(), fatal=True, switch=1))
    (cond,) = e.node_conditions()
    assert (cond.code, cond.severity, cond.since) == ("nvswitch-fatal", "unhealthy", first)
    assert "20034 on nvswitch1" in cond.message
    assert e.node_version == v0 + 2
    e.observe(ResetObservation(source="sim", at=clock.now(), reason="reboot"))
    assert e.node_conditions() == []
