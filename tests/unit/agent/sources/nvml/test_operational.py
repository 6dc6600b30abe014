"""GPU Operational Events and CPER through the NVML source, against the fake NVML with the
real pynvml structures: capability detection (R620, a driver answering FUNCTION_NOT_FOUND or
NOT_SUPPORTED, bindings without the functions), events with and without a legacy Xid, the
CPER read-back after a restart (deduplicated by record id, the ids kept per boot in the state
store and written on the event loop only), and the CPER parser's bad input."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.counters import Counters
from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.engine import DUPLICATE_XIDS
from gpuhealth.agent.observations import (
    Inventory,
    Observation,
    OperationalEventObservation,
    PciAddress,
    XidObservation,
)
from gpuhealth.agent.sources.kmsg.parser import parse_line
from gpuhealth.agent.sources.nvml.cper import (
    CPER_COUNTERS,
    CPER_MALFORMED,
    CPER_MALFORMED_SECTIONS,
    CPER_REPLAYED,
    CPER_SEEN,
    MAX_SEEN,
    NAME,
    CperReader,
    CperSeenIds,
)
from gpuhealth.agent.sources.nvml.cper_record import build_record, nvidia_section
from gpuhealth.agent.sources.nvml.operational import (
    NVML_OP_EVENT_ERRORS,
    NVML_OP_EVENTS,
    OperationalEventWaiter,
    text,
)
from gpuhealth.agent.sources.nvml.source import NvmlSource
from gpuhealth.agent.state_store import StateStore
from tests.fakes.fake_pynvml import FakeNvml, h100_node
from tests.fakes.fake_pynvml_goe import FakeNvmlGoe, goe_node
from tests.support.clock import FakeClock
from tests.support.wait import until
from tests.unit.agent.sources.nvml.test_source import Run

FATAL, INFO = pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_FATAL, 10
RECOVERABLE = pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_RECOVERABLE


@asynccontextmanager
async def running(
    fake: FakeNvml, state: StateStore | str | None = None, **settings: object
) -> AsyncIterator[Run]:
    """The NVML source on ``fake`` (as test_nvml's), with a state store for CPER."""
    r = Run(fake, **settings)
    r.source = NvmlSource(
        r.source.settings, r.clock, nvml_module=fake, state=state, boot_id="boot-1"
    )
    task = asyncio.create_task(r.source.run(r.got.append))
    try:
        await until(lambda: r.source.polls.count >= 1 or task.done())
        if task.done():
            task.result()
        yield r
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def ops(r: object) -> list[OperationalEventObservation]:
    return [o for o in r.got if isinstance(o, OperationalEventObservation)]  # type: ignore[attr-defined]


async def test_r620_event_with_legacy_xid_and_without() -> None:
    fake = goe_node(2)
    async with running(fake) as r:
        await until(lambda: r.source.event_paths()["operational_events"])
        assert r.source.event_paths() == {"nvml_xid": True, "operational_events": True}
        cursor = fake.inject_operational_event(
            1, "GPU-BUS", 0x0003, category=3, severity=FATAL, legacy_xid=79, cper=False
        )
        fake.inject_operational_event(
            0,
            "GPU-PSHC",
            0x0003,
            category=6,
            severity=30,
            attributes=pynvml.NVML_OPERATIONAL_EVENT_ATTR_OVERFLOW,
            group_attributes=pynvml.NVML_OPERATIONAL_EVENT_GROUP_ATTR_RECOVERED,
            cper=False,
        )
        await until(lambda: len(ops(r)) == 2)
        bus, pshc = ops(r)
        assert (bus.uuid, bus.module, bus.code, bus.category, bus.severity) == (
            fake.gpus[1].uuid, "GPU-BUS", 3, 3, FATAL,
        )  # fmt: skip
        assert bus.legacy_xid == 79 and bus.group_cursor == cursor and bus.via == "events"
        assert bus.attributes == pynvml.NVML_OPERATIONAL_EVENT_ATTR_PRIMARY
        assert pshc.legacy_xid is None
        assert pshc.attributes == pynvml.NVML_OPERATIONAL_EVENT_ATTR_OVERFLOW
        assert pshc.group_attributes == pynvml.NVML_OPERATIONAL_EVENT_GROUP_ATTR_RECOVERED
        assert r.source.counters.value(NVML_OP_EVENTS) == 2
        # The legacy path keeps running beside it.
        fake.inject_xid(1, 79)
        await until(lambda: any(isinstance(o, XidObservation) for o in r.got))


@pytest.mark.parametrize("goe", ["function_not_found", "not_supported"])
async def test_older_driver_keeps_the_legacy_paths(goe: str) -> None:
    fake = goe_node(2, driver="580.95.05", goe=goe)  # type: ignore[arg-type]
    async with running(fake) as r:
        await until(lambda: r.source._op is not None and r.source._op.unavailable != "not started")
        assert r.source.event_paths() == {"nvml_xid": True, "operational_events": False}
        assert "older than R615" in r.source._op.unavailable  # type: ignore[union-attr]
        fake.inject_xid(0, 48)
        await until(lambda: any(isinstance(o, XidObservation) for o in r.got))
        assert not ops(r)


async def test_bindings_without_operational_events() -> None:
    fake = h100_node(2)  # the plain fake: no v3 functions, no CPER (nvidia-ml-py before 13.615)
    async with running(fake) as r:
        await until(lambda: r.source._op is not None and r.source._op.unavailable != "not started")
        assert r.source.event_paths()["operational_events"] is False
        assert "bindings" in r.source._op.unavailable  # type: ignore[union-attr]


async def test_disabled_by_setting() -> None:
    fake = goe_node(1)
    async with running(fake, operational_events=False, cper_replay=False) as r:
        assert r.source.event_paths()["operational_events"] is False
        assert not fake.goe_sets


async def test_cper_fills_what_happened_while_down(tmp_path: Path) -> None:
    fake = goe_node(2)
    # While the agent was down: two groups on GPU 1 (one simulated).
    c1 = fake.inject_operational_event(
        1, "GPU-RAS", 0x30, category=2, severity=FATAL, deliver=False
    )
    fake.inject_operational_event(
        1, "GPU-RAS", 0x31, category=2, severity=FATAL, deliver=False,
        group_attributes=pynvml.NVML_OPERATIONAL_EVENT_GROUP_ATTR_SIMULATED,
    )  # fmt: skip
    async with running(fake, state=str(tmp_path)) as r:
        await until(lambda: len(ops(r)) == 2)
        first, sim = ops(r)
        assert first.via == "cper" and first.group_cursor == c1 and first.decoded
        assert (first.module, first.code, first.category) == ("GPU-RAS", 0x30, 2)
        # the driver writes a FATAL event's section RECOVERABLE (_gpuOpEventCperSeverity)
        assert first.severity == RECOVERABLE
        assert first.uuid == fake.gpus[1].uuid and first.at.year == 2026
        assert sim.group_attributes == pynvml.NVML_OPERATIONAL_EVENT_GROUP_ATTR_SIMULATED
        assert r.source.counters.value(CPER_REPLAYED) == 2
        # Seen live while up: remembered, so not read back again.
        await until(lambda: r.source.event_paths()["operational_events"])
        fake.inject_operational_event(0, "GPU-PSHC", 1, category=6, severity=INFO)
        await until(lambda: len(ops(r)) == 3)
    async with running(fake, state=str(tmp_path)) as r2:
        await until(lambda: r2.source.counters.value(CPER_SEEN) == 3)
        assert not [o for o in ops(r2) if o.via == "cper"]


async def test_cper_replay_reaches_one_verdict_per_record(tmp_path: Path) -> None:
    """Replayed and live reports of the same group are one occurrence in the engine."""
    fake = goe_node(1)
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    fake.inject_operational_event(0, "GPU-RAS", 0x30, category=2, severity=FATAL, deliver=False)
    async with running(fake, state=str(tmp_path)) as r:
        await until(lambda: len(ops(r)) == 1)
        for o in r.got:
            engine.observe(o)
        engine.observe(ops(r)[0])  # the same group again (e.g. live and CPER)
        (st_,) = engine.statuses()
        assert [c.code for c in st_.conditions] == ["goe-gpu-ras-0x0030"]
        assert st_.state == "degraded"  # never above degraded on a preview record alone


def test_cper_reader_grows_its_buffer_and_stops_on_errors() -> None:
    fake = goe_node(1)
    fake.nvmlInit()
    uuid = fake.gpus[0].uuid
    fake.cper[uuid].append(build_record(7, 1, body=b"x" * 70_000))
    counters = Counters(*CPER_COUNTERS)
    reader = CperReader(fake, counters, CperSeenIds(None, "b"), FakeClock().now)
    (rec,) = reader.read_gpu(uuid)
    assert rec.record_id == 7 and rec.length == 128 + 70_000 and reader.available
    fake.goe = "function_not_found"  # what R580 answers (device run on an H100)
    assert reader.read_gpu(uuid) == [] and reader.available is False
    assert reader.replay([]) == []


def _event(cursor: int, uuid: str = "GPU-a", via: str = "cper") -> OperationalEventObservation:
    return OperationalEventObservation(
        source="nvml",
        at=datetime(2026, 1, 1, tzinfo=UTC),
        uuid=uuid,
        module="CPER",
        code=0,
        category=0,
        severity=FATAL,
        group_cursor=cursor,
        via=via,  # type: ignore[arg-type]
    )


def test_seen_ids_are_kept_per_boot_in_the_state_store(tmp_path: Path) -> None:
    got: list[Observation] = []
    a = CperSeenIds(StateStore(tmp_path), "boot-1")
    a.hand_on(got.append, [_event(1), _event(2), _event(0, via="events")])
    assert len(got) == 3
    assert a.seen("GPU-a") == {1, 2}  # a live event's cursor 0 is no group
    assert CperSeenIds(StateStore(tmp_path), "boot-1").seen("GPU-a") == {1, 2}
    assert CperSeenIds(StateStore(tmp_path), "boot-2").seen("GPU-a") == frozenset()
    assert not list(tmp_path.glob("*.json"))  # no file beside the store
    StateStore(tmp_path).put_boot_value(NAME, "boot-1", b"{not json")
    assert CperSeenIds(StateStore(tmp_path), "boot-1").seen("GPU-a") == frozenset()


def test_a_live_groups_id_is_kept_with_its_last_event(tmp_path: Path) -> None:
    """nvmlEventSetWait_v3 delivers a group's events one by one (groupIndex of groupSize): an
    agent stopped after the first must read the group back, not skip it as handled."""
    waiter = OperationalEventWaiter(
        goe_node(1), FakeClock(), Counters(NVML_OP_EVENTS), [], wait_ms=1
    )
    p = pynvml.c_nvmlEventSetWait_v3_t()
    p.uuid, p.sourceModule, p.groupCursor, p.groupSize = b"GPU-a", b"GPU-RAS", 7, 2
    first = waiter.observation(None, p)
    p.groupIndex = 1
    second = waiter.observation(None, p)
    assert (first.group_last, second.group_last) == (False, True)
    ids = CperSeenIds(tmp_path, "b")
    ids.hand_on(lambda _: None, [first])
    assert CperSeenIds(tmp_path, "b").seen("GPU-a") == frozenset()
    ids.hand_on(lambda _: None, [second])
    assert CperSeenIds(tmp_path, "b").seen("GPU-a") == {7}


def test_seen_ids_are_bounded_per_gpu(tmp_path: Path) -> None:
    a = CperSeenIds(tmp_path, "b")
    a.hand_on(lambda _: None, [_event(i) for i in range(1, MAX_SEEN + 11)])
    a.hand_on(lambda _: None, [_event(7, uuid="GPU-b")])
    again = CperSeenIds(tmp_path, "b")
    assert again.seen("GPU-a") == set(range(11, MAX_SEEN + 11))
    assert again.seen("GPU-b") == {7}


def test_an_id_is_kept_only_with_what_the_sink_wrote(tmp_path: Path) -> None:
    """The sink runs first, in the same transaction: a sink that fails (the agent stopped in
    between) leaves the id unsaved, so the next start reads the record back."""
    store = StateStore(tmp_path)
    ids = CperSeenIds(store, "b")

    def sink(obs: Observation) -> None:
        assert store.boot_value(NAME, "b") == (None, False)  # not before the sink
        store.set_meta("handled", "1")  # what the engine driver writes (outbox, latched)
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        ids.hand_on(sink, [_event(5)])
    assert store.meta("handled") is None  # rolled back together
    assert CperSeenIds(tmp_path, "b").seen("GPU-a") == frozenset()

    ids.hand_on(lambda _: store.set_meta("handled", "1"), [_event(5)])
    assert store.meta("handled") == "1"
    assert CperSeenIds(tmp_path, "b").seen("GPU-a") == {5}


async def test_only_the_event_loop_writes_the_seen_ids(tmp_path: Path) -> None:
    """A live event (the waiter's thread) and a read-back record (the system thread) are both
    written on the loop, after the sink returned."""
    store = StateStore(tmp_path)
    writers: list[str] = []
    put = store.put_boot_value

    def spy(name: str, boot_id: str, value: bytes) -> bool:
        if name == NAME:
            writers.append(threading.current_thread().name)
        return put(name, boot_id, value)

    store.put_boot_value = spy  # type: ignore[method-assign]
    fake = goe_node(1)
    fake.inject_operational_event(0, "GPU-RAS", 0x30, category=2, severity=FATAL, deliver=False)
    async with running(fake, state=store) as r:
        await until(lambda: len(ops(r)) == 1)
        await until(lambda: r.source.event_paths()["operational_events"])
        live = fake.inject_operational_event(0, "GPU-PSHC", 1, category=6, severity=INFO)
        await until(lambda: len(ops(r)) == 2)
        await until(lambda: len(writers) == 2)
    assert writers == [threading.main_thread().name] * 2
    raw, _ = store.boot_value(NAME, "boot-1")
    assert raw is not None and live in msgspec.json.decode(raw)[fake.gpus[0].uuid]


async def test_a_driver_that_gains_operational_events_is_picked_up() -> None:
    """R580 at start (FUNCTION_NOT_FOUND); the driver is upgraded under the running agent."""
    fake = goe_node(1, driver="580.95.05", goe="function_not_found")
    async with running(fake, operational_events_recheck_s=0.05) as r:
        await until(lambda: r.source._op is not None and "R615" in r.source._op.unavailable)
        # a fault of the new driver before the agent registered: in its CPER log only
        early = fake.inject_operational_event(0, "GPU-RAS", 0x30, category=2, severity=FATAL)
        fake.goe = "supported"
        await until(lambda: r.source.event_paths()["operational_events"])
        await until(lambda: len(ops(r)) == 1)  # read back after the registration
        assert (ops(r)[0].via, ops(r)[0].group_cursor) == ("cper", early)
        fake.inject_operational_event(0, "GPU-PSHC", 1, category=6, severity=INFO, cper=False)
        await until(lambda: len(ops(r)) == 2)


async def test_an_event_set_that_keeps_failing_is_made_anew() -> None:
    """The driver was reloaded under the waiter: its event set answers errors; a new one works."""
    fake = goe_node(1)
    async with running(fake, operational_events_recheck_s=0.05) as r:
        await until(lambda: r.source.event_paths()["operational_events"])
        fake.goe_sets.clear()  # every wait on the old set now fails (INVALID_ARGUMENT)
        await until(lambda: bool(fake.goe_sets))  # registered anew
        await until(lambda: r.source.event_paths()["operational_events"])
        fake.inject_operational_event(0, "GPU-PSHC", 1, category=6, severity=INFO, cper=False)
        await until(lambda: len(ops(r)) == 1)
        assert r.source.counters.value(NVML_OP_EVENT_ERRORS) >= 5


# ----------------------------------------------------------------- issue 39: CPER, checked
# against NVIDIA's definitions (the shapes: tests/unit/agent/sources/nvml/test_cper_record.py)

XID79_LINE = (
    "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


def kernel_line(line: str = XID79_LINE) -> XidObservation:
    """The kernel log's line (GPU 0 of goe_node is 00000000:18:00.0), as the follower reads it."""
    parsed = parse_line(line)
    assert parsed is not None
    return XidObservation(
        source="kmsg",
        xid=parsed.xid,
        at=datetime(2026, 11, 26, 12, 0, tzinfo=UTC),
        pci=PciAddress.parse(parsed.pci_bus_id),
        message=parsed.message,
    )


def bus_fault_while_down(fake: FakeNvmlGoe) -> int:
    """GPU-BUS 0x0003 (R620 catalog: Xid 79, INTERCONNECT_ERROR), FATAL, while the agent is down:
    not delivered, only in the CPER log."""
    return fake.inject_operational_event(
        0, "GPU-BUS", 0x0003, category=3, severity=FATAL, legacy_xid=79, deliver=False
    )


@pytest.mark.parametrize("order", ["line-first", "record-first", "line-latched-before-restart"])
async def test_a_record_read_back_and_its_kernel_line_are_one_condition(
    tmp_path: Path, order: str
) -> None:
    """Before: the record was not decoded, so the restart turned one fault into two conditions
    (``xid-79`` and ``goe-cper-0x0000``). Now the NVIDIA section gives the module, code and
    legacy Xid, and the engine's XID dedup makes it one."""
    fake = goe_node(1)
    cursor = bus_fault_while_down(fake)
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    if order == "line-latched-before-restart":
        before = HealthEngine(HealthSettings(), clock)
        async with running(fake, cper_replay=False) as r0:
            for o in r0.got:
                before.observe(o)
        before.observe(kernel_line())
        assert before.xid_counts() == {(fake.gpus[0].uuid, 79): 1}
        clock.advance(3600.0)  # far past every window
        engine.restore_latched(before.latched())
    async with running(fake, state=str(tmp_path)) as r:
        await until(lambda: len(ops(r)) == 1)
        (record,) = ops(r)
        assert (record.module, record.code, record.legacy_xid, record.group_cursor) == (
            "GPU-BUS", 3, 79, cursor,
        )  # fmt: skip
        inventory = [o for o in r.got if isinstance(o, Inventory)]
        replay = [*inventory, record]
        if order == "line-first":
            steps: list[Observation] = [*inventory, kernel_line(), record]
        elif order == "record-first":
            steps = [*replay, kernel_line()]
        else:
            steps = replay
        for o in steps:
            engine.observe(o)
            clock.advance(1.0)
    (st_,) = engine.statuses()
    assert [c.code for c in st_.conditions] == ["xid-79"]
    (c,) = st_.conditions
    assert c.severity == "unhealthy" and c.action == "RESTART_BM"
    assert "GPU-BUS 0x0003" in c.message  # the record's facts went onto the verdict
    counted = engine.xid_counts().get((fake.gpus[0].uuid, 79), 0)
    assert counted == (0 if order == "line-latched-before-restart" else 1)  # one occurrence
    assert engine.counters.value(DUPLICATE_XIDS) == 1


async def test_r615_record_flags_are_not_read_as_group_attributes() -> None:
    """R615's cperInit writes the record flags 0 (open kernel modules 615.71.09): whatever a
    record's flags hold there, they are not RECOVERED / PREVERR / SIMULATED, so a real fault is
    not swallowed as a simulated one. From R620 they are the group's attributes."""
    simulated = pynvml.NVML_OPERATIONAL_EVENT_GROUP_ATTR_SIMULATED
    record = build_record(
        0x77,
        0,
        simulated,
        sections=[(nvidia_section("GPU-RAS", 2, 0x30), 0)],
    )
    judged = {}
    for driver in ("615.71.09", "620.10.01"):
        fake = goe_node(1, driver=driver)
        fake.cper[fake.gpus[0].uuid].append(record)
        async with running(fake) as r:
            await until(lambda: len(ops(r)) == 1)
            (obs,) = ops(r)
            engine = HealthEngine(HealthSettings(), FakeClock())
            for o in r.got:
                engine.observe(o)
            judged[driver] = (obs.group_attributes, engine.statuses()[0].state)
    assert judged == {"615.71.09": (0, "degraded"), "620.10.01": (simulated, "healthy")}


async def test_the_read_back_comes_after_the_registration() -> None:
    """A fault that comes while the agent starts, between its CPER read and its live
    registration, used to be missed until the next restart (read first, then register). Now
    the waiter registers, then reads back: the fault is delivered live (and, were it in the
    log already, counted once)."""
    fake = goe_node(2)
    calls: list[str] = []
    injected: list[int] = []
    read, register = fake.nvmlSystemGetCPER_v1, fake.nvmlEventSetRegisterGpuOperationalEvents_v1

    def cper(req: object) -> None:
        calls.append("cper")
        read(req)
        done = int(req.bufferSize) == 0  # type: ignore[attr-defined]
        last = text(req.cursor.uuid) == fake.gpus[-1].uuid  # type: ignore[attr-defined]
        if done and last and not injected:  # the read is over: a fault comes now
            injected.append(
                fake.inject_operational_event(1, "GPU-PSHC", 0x0004, category=6, severity=FATAL)
            )

    def reg(es: object, cfg: object) -> None:
        calls.append("register")
        register(es, cfg)  # type: ignore[arg-type]

    fake.nvmlSystemGetCPER_v1 = cper  # type: ignore[method-assign]
    fake.nvmlEventSetRegisterGpuOperationalEvents_v1 = reg  # type: ignore[method-assign]
    async with running(fake) as r:
        await until(lambda: len(ops(r)) >= 1)
        await asyncio.sleep(0.1)  # a second report of it would be here by now
        assert calls.index("cper") > calls.index("register") == 0
        assert calls[:2] == ["register", "register"]  # every GPU before the first read
        (obs,) = ops(r)
        assert (obs.via, obs.group_cursor) == ("events", injected[0])


async def test_a_fault_in_both_the_live_path_and_the_log_is_counted_once(tmp_path: Path) -> None:
    """Delivered live while the read-back reads it too: one verdict, one id remembered."""
    fake = goe_node(1)
    read = fake.nvmlSystemGetCPER_v1
    injected: list[int] = []

    def cper(req: object) -> None:
        if not injected:  # registered already: delivered live AND in the log being read
            injected.append(
                fake.inject_operational_event(0, "GPU-PSHC", 0x0004, category=6, severity=FATAL)
            )
        read(req)

    fake.nvmlSystemGetCPER_v1 = cper  # type: ignore[method-assign]
    engine = HealthEngine(HealthSettings(), FakeClock())
    async with running(fake, state=str(tmp_path)) as r:
        await until(lambda: {o.via for o in ops(r)} == {"events", "cper"})
        for o in r.got:
            engine.observe(o)
    assert engine.op_event_counts() == {
        (fake.gpus[0].uuid, "GPU-PSHC", 4, "POWER_ERROR", "code"): 1
    }
    assert CperSeenIds(StateStore(tmp_path), "boot-1").seen(fake.gpus[0].uuid) == {injected[0]}


async def test_cper_needs_root_and_its_absence_stops_nothing() -> None:
    fake = goe_node(2, cper_root=False)  # NVML_ERROR_NO_PERMISSION, as for a non-root agent
    async with running(fake) as r:
        await until(lambda: r.source.event_paths()["operational_events"])
        fake.inject_operational_event(1, "GPU-PSHC", 1, category=6, severity=INFO)
        await until(lambda: len(ops(r)) == 1)
        assert ops(r)[0].via == "events"


def test_a_record_with_a_broken_section_is_reported_whole() -> None:
    """Its events cannot all be known: one report of module CPER for the group, counted."""
    fake = goe_node(1)
    fake.nvmlInit()
    uuid = fake.gpus[0].uuid
    good = nvidia_section("GPU-RAS", 2, 0x30)
    broken = bytes([2]) + good[1:]  # event header version 2: not a layout we know
    fake.cper[uuid].append(build_record(0x55, 0, sections=[(good, 2), (broken, 0)]))
    counters = Counters(*CPER_COUNTERS)
    reader = CperReader(fake, counters, CperSeenIds(None, "b"), FakeClock().now, driver=620)
    (obs,) = reader.replay(fake_gpus(fake))
    assert (obs.module, obs.decoded, obs.severity, obs.group_cursor) == ("CPER", False, 30, 0x55)
    assert counters.value(CPER_MALFORMED_SECTIONS) == 1


def fake_gpus(fake: FakeNvmlGoe) -> list[object]:
    from gpuhealth.agent.observations import GpuIdentity
    from gpuhealth.agent.sources.nvml.gpu import NvmlGpu

    return [
        NvmlGpu(i, None, GpuIdentity(index=i, uuid=g.uuid, model="", pci_bus_id=""), None, None, ())
        for i, g in enumerate(fake.gpus)
    ]


@given(st.lists(st.binary(max_size=400), min_size=1, max_size=4))
def test_fuzz_the_reader_counts_garbage_and_never_raises(logs: list[bytes]) -> None:
    """Whatever the driver's buffer holds, the read-back hands on observations or counts it."""
    fake = goe_node(1)
    fake.nvmlInit()
    uuid = fake.gpus[0].uuid
    fake.cper[uuid] = [b for b in logs if b]
    counters = Counters(*CPER_COUNTERS)
    reader = CperReader(fake, counters, CperSeenIds(None, "b"), FakeClock().now, driver=620)
    out = reader.replay(fake_gpus(fake))  # type: ignore[arg-type]
    assert len(out) <= counters.value(CPER_REPLAYED) * 255
    assert counters.value(CPER_REPLAYED) + counters.value(CPER_MALFORMED) >= len(fake.cper[uuid])
