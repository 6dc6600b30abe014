"""The engine driver: observations -> engine -> snapshot, listeners and latched store; the
operator clear (engine -> transitions -> latched file -> metric)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.app import AgentApp
from gpuhealth.agent.engine_driver import (
    VERDICTS_CLEARED,
    ClearedGpu,
    EngineDriver,
    UnknownGpuError,
)
from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.observations import Inventory, PciAddress, XidObservation
from gpuhealth.agent.settings import load_config
from gpuhealth.agent.state_store import LatchedStore
from gpuhealth.agent.usage import UsageAccumulator
from gpuhealth.agent.wiring import build_agent
from tests.support.agent import XID79, full_sample, identity, uuid
from tests.support.clock import FakeClock


def _app(tmp_path: Path, clock: FakeClock) -> AgentApp:
    cfg = load_config(None, {"node_name": "n", "state_dir": str(tmp_path), "listen": "127.0.0.1:0"})
    return build_agent(cfg, clock=clock, sources=[], boot_id="boot-1")


def _listened(tmp_path: Path) -> tuple[FakeClock, NodeSnapshotCache, EngineDriver, list[int]]:
    """A driver over a real engine and snapshot whose node listener records each call."""
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    state = NodeSnapshotCache("n", engine, clock)
    asked: list[int] = []
    driver = EngineDriver(engine, state, LatchedStore(tmp_path, boot_id="b"), UsageAccumulator())
    driver.add_listener(lambda _t: None, lambda: asked.append(1))
    return clock, state, driver, asked


def test_sink_applies_observations_and_publishes(tmp_path: Path) -> None:
    clock = FakeClock()
    app = _app(tmp_path, clock)
    seen: list[Transition] = []
    app.parts.driver.add_listener(seen.append)
    sink = app.driver.observe
    assert not app.state.ready
    sink(Inventory(source="sim", gpus=(identity(0), identity(1))))
    sink(full_sample(0))
    sink(full_sample(1))
    assert app.state.ready
    before = app.snapshot()
    seen.clear()
    sink(
        XidObservation(
            source="kmsg",
            xid=79,
            at=clock.now(),
            pci=PciAddress.parse("00000000:19:00.0"),
            uuid=uuid(1),
        )
    )
    snap = app.snapshot()
    assert snap is not before
    assert {s.info.index: s.state for s in snap.statuses} == {0: "healthy", 1: "unhealthy"}
    assert [(t.uuid, t.current) for t in seen if t.kind == "transition"] == [(uuid(1), "unhealthy")]
    # the latched verdict was saved for a restart on the same boot
    restored = LatchedStore(tmp_path, boot_id="boot-1").load()
    assert [c.code for c in restored[uuid(1)]] == ["xid-79"]


def test_a_broken_listener_stops_neither_the_engine_nor_the_other_listeners(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    app = _app(tmp_path, clock)
    seen: list[Transition] = []

    def broken(_: Transition) -> None:
        raise RuntimeError("consumer bug")

    app.parts.driver.add_listener(broken)
    app.parts.driver.add_listener(seen.append)
    sink = app.driver.observe
    sink(Inventory(source="sim", gpus=(identity(0),)))
    sink(full_sample(0))
    seen.clear()
    sink(XidObservation(source="kmsg", xid=79, at=clock.now(), uuid=uuid(0)))
    assert [(t.uuid, t.current) for t in seen if t.kind == "transition"] == [(uuid(0), "unhealthy")]
    assert {s.info.index: s.state for s in app.snapshot().statuses} == {0: "unhealthy"}


def test_node_conditions_reach_the_snapshot_and_ask_for_a_stream_snapshot(
    tmp_path: Path,
) -> None:
    """A GPU missing from the bus changes no GPU's state: the driver tells its listener (the
    stream client queues a Snapshot) and the node snapshot carries the verdict."""
    from gpuhealth.agent.observations import LivenessObservation

    clock, state, driver, asked = _listened(tmp_path)
    driver.observe(Inventory(source="nvml", gpus=(identity(0),)))
    assert asked == [] and state.snapshot().gpus_missing == 0
    gone = LivenessObservation(
        source="nvml", kind="missing", at=clock.now(), detail="1 of 2", expected=2, visible=1
    )
    driver.observe(gone)
    driver.observe(gone)
    assert asked == [1]
    snap = state.snapshot()
    assert snap.gpus_missing == 1
    assert [c.code for c in snap.node_conditions] == ["gpu-missing"]
    driver.observe(
        LivenessObservation(source="nvml", kind="responsive", at=clock.now(), expected=2, visible=2)
    )
    assert asked == [1, 1] and state.snapshot().node_conditions == ()


def test_a_new_mig_layout_sends_a_snapshot(tmp_path: Path) -> None:
    """MIG devices created or destroyed change no GPU's state: the driver tells its listener,
    and the snapshot's GpuInfo names the new MIG UUIDs."""
    from dataclasses import replace

    from gpuhealth.agent.observations import MigDevice

    clock, state, driver, asked = _listened(tmp_path)
    driver.observe(Inventory(source="nvml", gpus=(identity(0),)))
    mig = MigDevice("MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b4", gpu_instance_id=1)
    smp = replace(full_sample(0), mig_mode=True, mig_devices=(mig,))
    driver.observe(smp)
    driver.observe(replace(smp, at=clock.now()))
    assert asked == [1]
    (gpu,) = state.snapshot().statuses
    assert [m.uuid for m in gpu.info.mig_devices] == [mig.uuid]


async def test_latched_verdicts_survive_agent_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    LatchedStore(tmp_path, boot_id="boot-1").save({uuid(2): [XID79]})
    app = _app(tmp_path, clock)
    seen: list[Transition] = []
    app.parts.driver.add_listener(seen.append)
    app.driver.restore_latched()
    assert [(t.uuid, t.current) for t in seen] == [(uuid(2), "unhealthy")]


def _xid_on_gpu1(app: AgentApp, clock: FakeClock) -> None:
    sink = app.driver.observe
    sink(Inventory(source="sim", gpus=(identity(0), identity(1))))
    sink(full_sample(0))
    sink(full_sample(1))
    sink(XidObservation(source="kmsg", xid=79, at=clock.now(), uuid=uuid(1)))


def test_clear_verdicts_goes_through_the_engine(tmp_path: Path) -> None:
    clock = FakeClock()
    app = _app(tmp_path, clock)
    _xid_on_gpu1(app, clock)
    store = LatchedStore(tmp_path, "boot-1")
    assert list(store.load()) == [uuid(1)]
    seen: list[Transition] = []
    app.parts.driver.add_listener(seen.append)

    cleared = app.driver.clear("1", "reseated", "uid=0 pid=1")

    assert cleared == [
        ClearedGpu(
            index=1,
            uuid=uuid(1),
            previous="unhealthy",
            current="healthy",
            conditions=["xid-79"],
        )
    ]
    assert [(t.uuid, t.previous, t.current) for t in seen] == [(uuid(1), "unhealthy", "healthy")]
    assert [s.state for s in app.snapshot().statuses] == ["healthy", "healthy"]
    assert LatchedStore(tmp_path, "boot-1").load() == {}
    assert app.driver.counters.value(VERDICTS_CLEARED) == 1

    # a healthy GPU has nothing to clear: reported, not counted, no transition
    seen.clear()
    again = app.driver.clear("all", "", "uid=0 pid=1")
    assert [(g.index, g.conditions) for g in again] == [(0, []), (1, [])]
    assert seen == [] and app.driver.counters.value(VERDICTS_CLEARED) == 1


def test_clear_unknown_gpu_changes_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    app = _app(tmp_path, clock)
    _xid_on_gpu1(app, clock)
    with pytest.raises(UnknownGpuError):
        app.driver.clear("GPU-unknown", "", "x")
    assert [s.state for s in app.snapshot().statuses] == ["healthy", "unhealthy"]
    assert app.driver.counters.value(VERDICTS_CLEARED) == 0
    assert list(LatchedStore(tmp_path, "boot-1").load()) == [uuid(1)]


def test_a_port_change_sends_a_snapshot_and_reaches_the_node_snapshot(tmp_path: Path) -> None:
    """A NIC port's state or verdicts change no GPU's by themselves: the driver tells its
    listener (a fresh Snapshot carries the ports); a counter's growth does not."""
    from dataclasses import replace

    from gpuhealth.agent.observations import NicObservation, NicPortSample

    clock, state, driver, asked = _listened(tmp_path)
    port = NicPortSample(device="mlx5_0", port=1, port_state="ACTIVE", phys_state="LinkUp",
                         rate_gbps=400.0, counters={"symbol_error": 1})  # fmt: skip
    driver.observe(NicObservation(source="rdma", at=clock.now(), ports=(port,)))
    assert asked == [1]
    driver.observe(
        NicObservation(
            source="rdma", at=clock.now(), ports=(replace(port, counters={"symbol_error": 2}),)
        )
    )
    assert asked == [1]
    driver.observe(
        NicObservation(source="rdma", at=clock.now(), ports=(replace(port, port_state="INIT"),))
    )
    assert asked == [1, 1]
    (nic,) = state.snapshot().nics
    assert nic.sample.port_state == "INIT"
