"""Random observation sequences: the engine never raises, and what it reports always fits the
wire contract (the controller's decoder validates every bound)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import (
    EccObservation,
    GpuIdentity,
    GpuSample,
    Inventory,
    LivenessObservation,
    Observation,
    PciAddress,
    ResetObservation,
    XidObservation,
)
from gpuhealth.protocol import Event, Snapshot, encode
from gpuhealth.protocol.codec import decode_agent
from tests.support.clock import FakeClock

UUIDS = [f"GPU-{i}" for i in range(3)]
AT = datetime(2026, 11, 22, tzinfo=UTC)
uuid_st = st.sampled_from(UUIDS)
maybe_int = st.one_of(st.none(), st.integers(0, 10**6))
maybe_temp = st.one_of(st.none(), st.floats(-50, 200))

sample_st = st.builds(
    GpuSample,
    uuid=uuid_st,
    at=st.just(AT),
    temperature_c=maybe_temp,
    slowdown_temperature_c=maybe_temp,
    utilization_ratio=st.one_of(st.none(), st.floats(-1, 2)),
    throttle_reasons=st.one_of(
        st.none(), st.frozensets(st.sampled_from(["hw_thermal", "power_cap", "x"]))
    ),
    ecc_sbe_volatile=maybe_int,
    ecc_dbe_volatile=maybe_int,
    ecc_dbe_aggregate=maybe_int,
    row_remap_pending=st.one_of(st.none(), st.booleans()),
    row_remap_failure=st.one_of(st.none(), st.booleans()),
    pcie_replay_count=maybe_int,
    nvlink_links_up=st.one_of(st.none(), st.integers(0, 18)),
    nvlink_links_total=st.one_of(st.none(), st.integers(0, 18)),
    nvlink_errors=maybe_int,
)
obs_st: st.SearchStrategy[Observation] = st.one_of(
    sample_st,
    st.builds(
        XidObservation,
        source=st.sampled_from(["nvml", "kmsg"]),
        xid=st.integers(0, 999_999),
        at=st.just(AT),
        uuid=st.one_of(st.none(), uuid_st),
        pci=st.one_of(st.none(), st.text(max_size=20).map(PciAddress.parse)),
        message=st.text(max_size=2000),
    ),
    st.builds(
        LivenessObservation,
        source=st.just("nvml"),
        kind=st.sampled_from(["lost", "unresponsive", "missing", "responsive"]),
        at=st.just(AT),
        uuid=st.one_of(st.none(), uuid_st),
    ),
    st.builds(
        EccObservation,
        source=st.just("nvml"),
        uuid=uuid_st,
        at=st.just(AT),
        double_bit=st.booleans(),
    ),
    st.builds(
        ResetObservation, source=st.just("nvml"), at=st.just(AT), uuid=st.one_of(st.none(), uuid_st)
    ),
    st.builds(
        Inventory,
        source=st.just("nvml"),
        gpus=st.lists(st.sampled_from(range(3)), unique=True, max_size=3).map(
            lambda ix: tuple(
                GpuIdentity(index=i, uuid=UUIDS[i], model="H100", pci_bus_id=f"0:{i}") for i in ix
            )
        ),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(obs_st, st.floats(0, 400)), max_size=40))
def test_engine_output_always_fits_the_contract(steps: list[tuple[Observation, float]]) -> None:
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    seq = 0
    for obs, dt in steps:
        clock.advance(dt)
        for t in [*engine.observe(obs), *engine.tick()]:
            seq += 1
            ev = Event(
                seq=seq,
                node="n",
                at=t.at,
                kind=t.kind,
                gpu_uuid=t.uuid,
                gpu_index=t.index,
                previous=t.previous,
                current=t.current,
                conditions=list(t.conditions),
                xid=t.xid,
            )
            assert decode_agent(encode(ev)) == ev
    seq += 1
    snap = Snapshot(seq=seq, node="n", taken_at=clock.now(), gpus=engine.statuses())
    assert decode_agent(encode(snap)) == snap
    for s in snap.gpus:
        assert s.state == "healthy" or s.conditions or s.state == "unknown"
