"""The runtime's pieces without servers: hub, sink -> engine -> snapshot, stream view,
latched-verdict store, PCI address lookup."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from gpuhealth.agent.app import AgentApp
from gpuhealth.agent.config import load_config
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.latched_store import LatchedStore
from gpuhealth.agent.observations import Inventory, XidObservation
from gpuhealth.agent.snapshot import NodeState
from gpuhealth.agent.sources.pci import normalize_pci, pci_lookup
from gpuhealth.agent.stream.state_provider import SnapshotStateProvider
from gpuhealth.agent.transition_fanout import TransitionFanout
from gpuhealth.agent.usage import UsageAccumulator
from gpuhealth.common.clock import FakeClock
from gpuhealth.protocol import GpuTelemetry
from tests.unit.agent_fixtures import (
    AT,
    XID79,
    alloc,
    engine_with,
    full_sample,
    identity,
    uuid,
    xid_action,
)


def _t(i: int, current: str = "unhealthy") -> Transition:
    return Transition(
        kind="transition",
        uuid=uuid(i),
        index=i,
        previous="healthy",
        current=current,  # type: ignore[arg-type]
        conditions=(XID79,),
        at=AT,
        xid=79,
    )


async def test_hub_fans_out_to_listeners_and_subscribers() -> None:
    hub = TransitionFanout()
    seen: list[Transition] = []
    hub.add_listener(seen.append)

    def broken(_: Transition) -> None:
        raise RuntimeError("consumer bug")

    hub.add_listener(broken)
    sub = hub.subscribe(maxsize=2)
    hub.publish([_t(0), _t(1), _t(2)])
    assert [t.index for t in seen] == [0, 1, 2]
    assert sub.overflowed  # the oldest was dropped
    assert (await sub.get()).index == 1
    assert sub.get_nowait().index == 2  # type: ignore[union-attr]
    assert sub.get_nowait() is None
    sub.close()
    hub.publish([_t(3)])
    assert sub.pending() == 0 and hub.subscribers == 0


async def test_subscription_async_iteration() -> None:
    hub = TransitionFanout()
    sub = hub.subscribe()
    got: list[int] = []

    async def consume() -> None:
        async for t in sub:
            got.append(t.index)
            if len(got) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    hub.publish([_t(4), _t(5)])
    await asyncio.wait_for(task, 1)
    assert got == [4, 5]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00", "0000:1b:00.0"),
        ("0000:1B:00.1", "0000:1b:00.1"),
        ("1b:00.0", "0000:1b:00.0"),
        ("garbage", None),
        ("zz:yy:xx", None),
    ],
)
def test_normalize_pci(address: str, expected: str | None) -> None:
    assert normalize_pci(address) == expected


def test_pci_lookup_follows_inventory() -> None:
    engine = engine_with(2)
    lookup = pci_lookup(engine)
    assert lookup("0000:19:00") == uuid(1)
    assert lookup("0000:99:00") is None
    engine.inv = Inventory(source="sim", gpus=(identity(0),))
    assert lookup("0000:19:00") is None
    engine.inv = None
    assert lookup("0000:18:00") is None


def test_usage_and_heartbeat() -> None:
    engine = engine_with(2)
    engine.stat = [
        msgspec.structs.replace(s, telemetry=GpuTelemetry(uuid=s.info.uuid, temperature_c=40.0))
        for s in engine.stat
    ]
    state = NodeState("n", engine, FakeClock(), xid_action)  # type: ignore[arg-type]
    state.set_allocations([alloc(0, "train")])
    usage = UsageAccumulator()
    view = SnapshotStateProvider(state, usage, version="v")
    for ratio in (0.2, 0.4):
        usage.record(full_sample(0).__class__(uuid=uuid(0), at=AT, utilization_ratio=ratio))
    usage.record(full_sample(1))
    got, tele = view.heartbeat()
    assert [(u.pod, u.samples, u.attribution) for u in got] == [("train", 2, "gpu")]
    assert got[0].utilization_ratio == pytest.approx(0.3)
    assert [t.uuid for t in tele] == [uuid(0), uuid(1)]
    assert tele[0].throttled is False and tele[0].temperature_c == 40.0
    assert view.heartbeat()[0] == []  # drained
    gpus, allocations = view.snapshot()
    assert len(gpus) == 2 and [a.pod for a in allocations] == ["train"]
    hello = view.hello_info()
    assert hello.node == "n" and [g.index for g in hello.gpus] == [0, 1]


def test_latched_store_round_trip_and_reboot(tmp_path: Path) -> None:
    store = LatchedStore(tmp_path, boot_id="boot-1")
    assert store.load() == {}
    store.save({uuid(0): [XID79]})
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {uuid(0): [XID79]}
    assert LatchedStore(tmp_path, boot_id="boot-2").load() == {}
    (tmp_path / "latched.json").write_text("{not json")
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {}


def _app(tmp_path: Path, clock: FakeClock) -> AgentApp:
    cfg = load_config(None, {"node_name": "n", "state_dir": str(tmp_path), "listen": "127.0.0.1:0"})
    return AgentApp(cfg, clock=clock, sources=[], boot_id="boot-1")


def test_sink_applies_observations_and_publishes(tmp_path: Path) -> None:
    clock = FakeClock()
    app = _app(tmp_path, clock)
    seen: list[Transition] = []
    app.subscribe_transitions(seen.append)
    sink = app.sink_for("sim")
    assert not app.state.ready
    sink(Inventory(source="sim", gpus=(identity(0), identity(1))))
    sink(full_sample(0))
    sink(full_sample(1))
    assert app.state.ready
    assert app.stats.sources["sim"].up
    before = app.snapshot()
    seen.clear()
    sink(
        XidObservation(
            source="kmsg", xid=79, at=clock.now(), pci_bus_id="00000000:19:00.0", uuid=uuid(1)
        )
    )
    snap = app.snapshot()
    assert snap is not before
    assert {s.info.index: s.state for s in snap.statuses} == {0: "healthy", 1: "unhealthy"}
    assert [(t.uuid, t.current) for t in seen if t.kind == "transition"] == [(uuid(1), "unhealthy")]
    # the latched verdict was saved for a restart on the same boot
    restored = LatchedStore(tmp_path, boot_id="boot-1").load()
    assert [c.code for c in restored[uuid(1)]] == ["xid-79"]


async def test_latched_verdicts_survive_agent_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    LatchedStore(tmp_path, boot_id="boot-1").save({uuid(2): [XID79]})
    app = _app(tmp_path, clock)
    seen: list[Transition] = []
    app.subscribe_transitions(seen.append)
    app.latched_restore()
    assert [(t.uuid, t.current) for t in seen] == [(uuid(2), "unhealthy")]


def test_source_failure_marks_it_down(tmp_path: Path) -> None:
    app = _app(tmp_path, FakeClock())
    app.sink_for("nvml")(full_sample(0).__class__(uuid=uuid(0), at=AT + timedelta(seconds=1)))
    app._on_task_failure("source-nvml", RuntimeError("NVML_ERROR_UNKNOWN"))
    app._on_task_failure("engine-tick", RuntimeError("not a source"))
    h = app.stats.sources["nvml"]
    assert (h.up, h.errors_total, h.last_error) == (False, 1, "NVML_ERROR_UNKNOWN")
    assert set(app.stats.sources) == {"nvml"}


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"source": "sim", "kmsg_path": "none"}, ["sim"]),
        ({"source": "sim", "kmsg_path": "/dev/kmsg"}, ["sim", "kmsg"]),
        ({"source": "nvml", "kmsg_path": "none"}, ["nvml"]),
        ({"source": "dcgm-exporter", "kmsg_path": "/tmp/k"}, ["dcgm", "kmsg"]),
    ],
)
def test_build_sources(overrides: dict[str, str], names: list[str]) -> None:
    from gpuhealth.agent.sources.factory import build_sources

    cfg = load_config(None, {"node_name": "n", **overrides})
    sources = build_sources(cfg, FakeClock(), lambda _: None)
    assert [s.name for s in sources] == names


def test_build_sources_loads_the_scenario(tmp_path: Path) -> None:
    from gpuhealth.agent.sources.factory import build_sources

    path = tmp_path / "s.yaml"
    path.write_text("name: t\ngpus: 3\n")
    cfg = load_config(None, {"node_name": "n", "source": "sim", "sim_scenario": str(path)})
    sim = build_sources(cfg, FakeClock(), lambda _: None)[0]
    assert len(sim.inventory().gpus) == 3  # type: ignore[attr-defined]


class _Idle:
    def __init__(self, name: str, **attrs: object) -> None:
        self.name = name
        for k, v in attrs.items():
            setattr(self, k, v)

    async def run(self, sink: object) -> None:
        await asyncio.Event().wait()


async def test_pull_counters_from_sources(tmp_path: Path) -> None:
    kmsg = _Idle("kmsg", up=False, lines_total=5, malformed_total=1)
    nvml = _Idle("nvml", up=False, call_timeouts_total={0: 2})
    cfg = load_config(None, {"node_name": "n", "state_dir": str(tmp_path)})
    app = AgentApp(cfg, clock=FakeClock(), sources=[kmsg, nvml], boot_id="b")  # type: ignore[list-item]
    app._all_sources = [kmsg, nvml]  # type: ignore[list-item]
    app._kmsg = kmsg  # type: ignore[assignment]
    for src in (kmsg, nvml):
        app.supervisor.start(f"source-{src.name}", lambda src=src: src.run(None))
    await asyncio.sleep(0)
    try:
        app._pull_counters()
        # a silent kernel log is up while its follower runs; NVML reports its own state
        assert app.stats.sources["kmsg"].up is True
        assert app.stats.sources["nvml"].up is False
        nvml.up = True  # type: ignore[attr-defined]
        app._pull_counters()
        assert app.stats.sources["nvml"].up is True
        assert app.stats.kmsg_lines_total == 5 and app.stats.kmsg_malformed_lines_total == 1
        assert app.stats.nvml_call_timeouts == {0: 2}
    finally:
        await app.supervisor.stop()
    app._pull_counters()
    assert not app.stats.sources["kmsg"].up and not app.stats.sources["nvml"].up


async def test_alive_ignores_failing_sources(tmp_path: Path) -> None:
    cfg = load_config(None, {"node_name": "n", "state_dir": str(tmp_path)})
    app = AgentApp(cfg, clock=FakeClock(), sources=[], boot_id="b")

    async def idle() -> None:
        await asyncio.Event().wait()

    async def broken() -> None:
        raise RuntimeError("nvml gone")

    assert not app.alive()
    app.supervisor.start("engine-tick", idle)
    app.supervisor.start("source-nvml", broken)
    await asyncio.sleep(0)
    assert not app.alive()  # no HTTP server yet
    app.supervisor.start("http", idle)
    await asyncio.sleep(0)
    try:
        assert app.supervisor.status()["source-nvml"]["failures"] == 1
        assert app.alive()
    finally:
        await app.supervisor.stop()
