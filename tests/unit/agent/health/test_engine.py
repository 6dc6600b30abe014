"""Health model, one table row per rule (docs/architecture.md "Agent"), driven by a FakeClock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.engine import (
    DUPLICATE_XIDS,
    UNKNOWN_OBSERVATIONS,
    UNMAPPED_XIDS,
    UnknownObservationError,
)
from gpuhealth.agent.observations import (
    EccObservation,
    GpuIdentity,
    GpuSample,
    Inventory,
    LivenessObservation,
    PciAddress,
    ResetObservation,
    XidObservation,
)
from tests.support.clock import FakeClock

U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
PCI0 = "00000000:1B:00.0"


class World:
    def __init__(self, settings: HealthSettings | None = None) -> None:
        self.clock = FakeClock()
        self.engine = HealthEngine(settings or HealthSettings(), self.clock)
        self.base = GpuSample(
            uuid=U0,
            at=self.clock.now(),
            temperature_c=45.0,
            slowdown_temperature_c=90.0,
            shutdown_temperature_c=95.0,
            throttle_reasons=frozenset(),
            ecc_sbe_volatile=0,
            ecc_dbe_volatile=0,
            ecc_sbe_aggregate=0,
            ecc_dbe_aggregate=0,
            row_remap_pending=False,
            row_remap_failure=False,
            retired_pages_pending=False,
            pcie_replay_count=0,
            nvlink_links_up=18,
            nvlink_links_total=18,
            nvlink_errors=0,
        )
        self.transitions: list[Any] = []
        self.engine.observe(
            Inventory(
                source="sim",
                gpus=(
                    GpuIdentity(index=0, uuid=U0, model="H100", pci_bus_id=PCI0),
                    GpuIdentity(index=1, uuid=U1, model="H100", pci_bus_id="00000000:2A:00.0"),
                ),
            )
        )
        self.sample()

    def sample(self, **kw: Any) -> None:
        self.transitions += self.engine.observe(replace(self.base, at=self.clock.now(), **kw))

    def samples(self, n: int, every: float = 1.0, **kw: Any) -> None:
        for _ in range(n):
            self.clock.advance(every)
            self.sample(**kw)

    def xid(self, xid: int, source: str = "kmsg", msg: str = "", **kw: Any) -> None:
        self.transitions += self.engine.observe(
            XidObservation(source=source, xid=xid, at=self.clock.now(), message=msg, **kw)  # type: ignore[arg-type]
        )

    def tick(self, advance: float = 0.0) -> None:
        self.clock.advance(advance)
        self.transitions += self.engine.tick()

    @property
    def gpu0(self) -> Any:
        return self.engine.statuses()[0]

    def codes(self) -> set[str]:
        return {c.code for c in self.gpu0.conditions}


Step = Callable[[World], None]


@dataclass
class Row:
    rule: str
    steps: list[Step]
    state: str
    codes: set[str]


def _clean_window(w: World) -> None:
    w.samples(310, every=1.0)
    w.tick()


ROWS = [
    Row("baseline sample is healthy", [], "healthy", set()),
    Row("xid 79 -> unhealthy RESTART_BM", [lambda w: w.xid(79, uuid=U0)], "unhealthy", {"xid-79"}),
    Row("xid 13 alone counted, healthy", [lambda w: w.xid(13, uuid=U0)], "healthy", set()),
    Row("xid 31 alone healthy", [lambda w: w.xid(31, uuid=U0)], "healthy", set()),
    Row("xid 43 alone healthy", [lambda w: w.xid(43, uuid=U0)], "healthy", set()),
    Row("xid 45 alone healthy", [lambda w: w.xid(45, uuid=U0)], "healthy", set()),
    Row("xid 48 dbe -> unhealthy", [lambda w: w.xid(48, uuid=U0)], "unhealthy", {"xid-48"}),
    Row("xid 64 -> unhealthy", [lambda w: w.xid(64, uuid=U0)], "unhealthy", {"xid-64"}),
    Row("xid 74 nvlink -> unhealthy", [lambda w: w.xid(74, uuid=U0)], "unhealthy", {"xid-74"}),
    Row("xid 95 -> unhealthy", [lambda w: w.xid(95, uuid=U0)], "unhealthy", {"xid-95"}),
    Row("xid 119 gsp -> unhealthy", [lambda w: w.xid(119, uuid=U0)], "unhealthy", {"xid-119"}),
    Row("unknown xid -> degraded", [lambda w: w.xid(4242, uuid=U0)], "degraded", {"xid-4242"}),
    Row(
        "xid by PCI address maps to the GPU",
        [lambda w: w.xid(62, pci=PciAddress.parse(PCI0.lower()))],
        "unhealthy",
        {"xid-62"},
    ),
    Row(
        "xid 154 node reboot required -> unhealthy",
        [
            lambda w: w.xid(
                154, uuid=U0, msg="action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
            )
        ],
        "unhealthy",
        {"xid-154"},
    ),
    Row(
        "repeated application xids escalate to degraded",
        [lambda w: [w.xid(13, uuid=U0, source="nvml") or w.clock.advance(60) for _ in range(5)]],
        "degraded",
        {"xid-repeated"},
    ),
    Row(
        "one crash logging 50 XID 13 lines is one burst: no escalation",
        [lambda w: [w.xid(13, uuid=U0, source="kmsg") or w.clock.advance(0.05) for _ in range(50)]],
        "healthy",
        set(),
    ),
    Row(
        "cancelled jobs (43, 45) never escalate",
        [lambda w: [w.xid(x, uuid=U0, source="kmsg") or w.samples(60) for x in [43, 45] * 10]],
        "healthy",
        set(),
    ),
    Row(
        "repeated app xid escalation clears after a clean window",
        [
            lambda w: [w.xid(13, uuid=U0, source="nvml") or w.clock.advance(60) for _ in range(5)],
            _clean_window,
        ],
        "healthy",
        set(),
    ),
    Row(
        "xid latches through a clean window",
        [lambda w: w.xid(79, uuid=U0), _clean_window],
        "unhealthy",
        {"xid-79"},
    ),
    Row(
        "xid clears on GPU reset",
        [
            lambda w: w.xid(79, uuid=U0),
            lambda w: w.engine.observe(ResetObservation(source="sim", at=w.clock.now(), uuid=U0)),
            lambda w: w.sample(),
        ],
        "healthy",
        set(),
    ),
    Row(
        "xid clears on node reboot (reset without uuid)",
        [
            lambda w: w.xid(48, uuid=U0),
            lambda w: w.engine.observe(
                ResetObservation(source="sim", at=w.clock.now(), reason="reboot")
            ),
        ],
        "healthy",
        set(),
    ),
    Row(
        "operator clear",
        [lambda w: w.xid(79, uuid=U0), lambda w: w.engine.clear(U0)],
        "healthy",
        set(),
    ),
    Row(
        "new volatile DBE -> unhealthy",
        [lambda w: w.samples(1, ecc_dbe_volatile=1)],
        "unhealthy",
        {"ecc-dbe"},
    ),
    Row(
        "DBE latches although the counter stays",
        [
            lambda w: w.samples(1, ecc_dbe_volatile=1),
            lambda w: w.samples(400, ecc_dbe_volatile=1),
            lambda w: w.tick(),
        ],
        "unhealthy",
        {"ecc-dbe"},
    ),
    Row(
        "volatile counters going backwards count as a reset",
        [lambda w: w.samples(2, ecc_dbe_volatile=2), lambda w: w.samples(1, ecc_dbe_volatile=0)],
        "healthy",
        set(),
    ),
    Row(
        "aggregate DBE growth -> unhealthy",
        [lambda w: w.samples(1, ecc_dbe_volatile=None, ecc_dbe_aggregate=3)],
        "unhealthy",
        {"ecc-dbe"},
    ),
    Row(
        "DBE event from NVML -> unhealthy",
        [
            lambda w: w.engine.observe(
                EccObservation(source="nvml", uuid=U0, at=w.clock.now(), double_bit=True)
            )
        ],
        "unhealthy",
        {"ecc-dbe"},
    ),
    Row(
        "SBE event alone does nothing",
        [
            lambda w: w.engine.observe(
                EccObservation(source="nvml", uuid=U0, at=w.clock.now(), double_bit=False)
            )
        ],
        "healthy",
        set(),
    ),
    Row(
        "SBE rate over threshold -> degraded",
        [lambda w: [w.samples(1, ecc_sbe_volatile=50 * i) for i in range(1, 6)]],
        "degraded",
        {"ecc-sbe-rate"},
    ),
    Row(
        "SBE under threshold stays healthy",
        [lambda w: w.samples(5, ecc_sbe_volatile=20)],
        "healthy",
        set(),
    ),
    Row(
        "row remap pending -> degraded RESET_GPU",
        [lambda w: w.samples(2, row_remap_pending=True)],
        "degraded",
        {"row-remap-pending"},
    ),
    Row(
        "one row remap pending sample is noise",
        [lambda w: w.samples(1, row_remap_pending=True)],
        "healthy",
        set(),
    ),
    Row(
        "retired pages pending -> degraded",
        [lambda w: w.samples(2, retired_pages_pending=True)],
        "degraded",
        {"retired-pages-pending"},
    ),
    Row(
        "row remap failure -> unhealthy CONTACT_SUPPORT",
        [lambda w: w.samples(2, row_remap_failure=True)],
        "unhealthy",
        {"row-remap-failure"},
    ),
    Row(
        "row remap failure latches",
        [
            lambda w: w.samples(2, row_remap_failure=True),
            lambda w: w.samples(400),
            lambda w: w.tick(),
        ],
        "unhealthy",
        {"row-remap-failure"},
    ),
    Row(
        "temperature at slowdown -> degraded",
        [lambda w: w.samples(3, temperature_c=90.0)],
        "degraded",
        {"thermal"},
    ),
    Row(
        "one hot sample never flips",
        [lambda w: w.samples(1, temperature_c=99.0), lambda w: w.samples(2)],
        "healthy",
        set(),
    ),
    Row(
        "temperature at shutdown -> unhealthy",
        [lambda w: w.samples(3, temperature_c=96.0)],
        "unhealthy",
        {"thermal", "thermal-shutdown"},
    ),
    Row(
        "uses the fallback threshold when the GPU reports none",
        [lambda w: w.samples(3, temperature_c=91.0, slowdown_temperature_c=None)],
        "degraded",
        {"thermal"},
    ),
    Row(
        "thermal clears after a clean window",
        [lambda w: w.samples(3, temperature_c=92.0), _clean_window],
        "healthy",
        set(),
    ),
    Row(
        "thermal does not clear before the clean window",
        [lambda w: w.samples(3, temperature_c=92.0), lambda w: w.samples(100)],
        "degraded",
        {"thermal"},
    ),
    Row(
        "hw thermal throttle sustained -> degraded",
        [lambda w: w.samples(31, throttle_reasons=frozenset({"hw_thermal"}))],
        "degraded",
        {"thermal-throttle"},
    ),
    Row(
        "short throttle burst stays healthy",
        [lambda w: w.samples(10, throttle_reasons=frozenset({"hw_slowdown"}))],
        "healthy",
        set(),
    ),
    Row(
        "power cap throttling is normal",
        [lambda w: w.samples(60, throttle_reasons=frozenset({"power_cap"}))],
        "healthy",
        set(),
    ),
    Row(
        "GPU lost -> unhealthy",
        [
            lambda w: w.engine.observe(
                LivenessObservation(source="nvml", kind="lost", at=w.clock.now(), uuid=U0)
            )
        ],
        "unhealthy",
        {"gpu-lost"},
    ),
    Row(
        "unresponsive -> unhealthy",
        [
            lambda w: w.engine.observe(
                LivenessObservation(source="nvml", kind="unresponsive", at=w.clock.now(), uuid=U0)
            )
        ],
        "unhealthy",
        {"gpu-unresponsive"},
    ),
    Row(
        "unresponsive clears once samples flow for the liveness window",
        [
            lambda w: w.engine.observe(
                LivenessObservation(source="nvml", kind="unresponsive", at=w.clock.now(), uuid=U0)
            ),
            lambda w: w.samples(31),
        ],
        "healthy",
        set(),
    ),
    Row(
        "missing GPU (uuid) -> unhealthy",
        [
            lambda w: w.engine.observe(
                LivenessObservation(source="nvml", kind="missing", at=w.clock.now(), uuid=U0)
            )
        ],
        "unhealthy",
        {"gpu-missing"},
    ),
    Row(
        "NVLink down -> degraded",
        [lambda w: w.samples(3, nvlink_links_up=16)],
        "degraded",
        {"nvlink-down"},
    ),
    Row(
        "NVLink errors rising -> degraded",
        [lambda w: [w.samples(1, nvlink_errors=60 * i) for i in range(1, 5)]],
        "degraded",
        {"nvlink-errors"},
    ),
    Row(
        "PCIe replay rate -> degraded",
        [lambda w: [w.samples(1, pcie_replay_count=60 * i) for i in range(1, 5)]],
        "degraded",
        {"pcie-replays"},
    ),
    Row(
        "worst severity wins",
        [lambda w: w.samples(3, temperature_c=91.0), lambda w: w.xid(79, uuid=U0)],
        "unhealthy",
        {"thermal", "xid-79"},
    ),
    Row("no sample for the stale window -> unknown", [lambda w: w.tick(121)], "unknown", set()),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.rule for r in ROWS])
def test_rule(row: Row) -> None:
    w = World()
    for step in row.steps:
        step(w)
    assert w.gpu0.state == row.state
    assert w.codes() == row.codes
    assert w.engine.statuses()[1].state == "unknown"  # the other GPU never got a sample


def test_xid_condition_carries_catalog_action_and_since() -> None:
    w = World()
    w.clock.advance(3)
    w.xid(79, uuid=U0, msg="GPU has fallen off the bus.")
    (cond,) = w.gpu0.conditions
    assert (cond.reason, cond.action, cond.xid, cond.severity) == (
        "XidError",
        "RESTART_BM",
        79,
        "unhealthy",
    )
    assert cond.since == w.clock.now()


def test_a_replayed_xid_keeps_the_time_it_was_logged() -> None:
    """The kernel-log replay dates an XID by its record: its condition and its transition say
    when it happened, not when the agent read it."""
    w = World()
    w.clock.advance(3600)
    logged = w.clock.now() - timedelta(minutes=50)
    w.transitions += w.engine.observe(
        XidObservation(source="kmsg", xid=79, at=logged, uuid=U0, message="fallen off the bus")
    )
    (cond,) = w.gpu0.conditions
    assert cond.since == logged
    assert [t.at for t in w.transitions if t.xid == 79] == [logged]


def test_transitions_and_xid_events() -> None:
    w = World()
    w.transitions.clear()
    w.xid(13, uuid=U0)
    (t,) = w.transitions
    assert (t.kind, t.previous, t.current, t.xid) == ("xid", "healthy", "healthy", 13)
    w.xid(79, uuid=U0)
    t = w.transitions[-1]
    assert (t.kind, t.previous, t.current, t.xid) == ("transition", "healthy", "unhealthy", 79)
    assert [c.code for c in t.conditions] == ["xid-79"]


def test_same_xid_from_two_sources_counts_once() -> None:
    w = World()
    w.xid(79, uuid=U0, source="nvml")
    w.xid(79, uuid=U0, source="kmsg")
    assert w.engine.xid_counts() == {(U0, 79): 1}
    assert w.engine.counters.value(DUPLICATE_XIDS) == 1
    w.clock.advance(10)
    w.xid(79, uuid=U0, source="kmsg")
    assert w.engine.xid_counts() == {(U0, 79): 2}


def test_unmapped_xid_is_counted_not_raised() -> None:
    w = World()
    w.xid(79, pci=PciAddress.parse("00000000:99:00.0"))
    assert w.engine.counters.value(UNMAPPED_XIDS) == 1
    assert w.gpu0.state == "healthy"


@pytest.mark.parametrize("obs", [object(), None, "reset", 42])
def test_an_unknown_observation_is_rejected_loudly_and_resets_nothing(obs: object) -> None:
    w = World()
    w.xid(79, uuid=U0)
    before = w.engine.statuses()
    with pytest.raises(UnknownObservationError, match=type(obs).__name__):
        w.engine.observe(obs)  # type: ignore[arg-type]
    assert w.engine.counters.value(UNKNOWN_OBSERVATIONS) == 1
    assert w.engine.statuses() == before  # the latched XID stays: no reset of every GPU
    assert w.codes() == {"xid-79"}


def test_gpu_leaving_the_inventory_is_missing_and_returns() -> None:
    w = World()
    inv = w.engine.inventory()
    assert inv is not None
    w.engine.observe(replace(inv, gpus=inv.gpus[1:]))
    assert w.gpu0.state == "unhealthy"
    assert w.codes() == {"gpu-missing"}
    w.engine.observe(inv)
    assert w.codes() == set()


def test_node_level_missing_condition() -> None:
    w = World()
    w.engine.observe(
        LivenessObservation(source="nvml", kind="missing", at=w.clock.now(), detail="7 of 8")
    )
    assert [c.code for c in w.engine.node_conditions()] == ["gpu-missing"]
    assert w.engine.gpus_missing() == 1  # at least one, when the source gives no counts


def test_node_level_missing_counts_keep_since_and_clear() -> None:
    w = World()
    v0 = w.engine.node_version
    first = w.clock.now()

    def missing(visible: int) -> None:
        w.engine.observe(
            LivenessObservation(
                source="nvml",
                kind="missing",
                at=w.clock.now(),
                detail=f"{visible} of 8 expected GPUs visible",
                expected=8,
                visible=visible,
            )
        )

    missing(6)
    assert w.engine.gpus_missing() == 2 and w.engine.node_version == v0 + 1
    w.clock.advance(30)
    missing(6)  # the same verdict again: no change
    assert w.engine.node_version == v0 + 1
    missing(7)
    (cond,) = w.engine.node_conditions()
    assert (cond.message, cond.since, cond.severity) == (
        "7 of 8 expected GPUs visible",
        first,
        "unhealthy",
    )
    assert w.engine.gpus_missing() == 1 and w.engine.node_version == v0 + 2
    w.engine.observe(
        LivenessObservation(
            source="nvml", kind="responsive", at=w.clock.now(), expected=8, visible=8
        )
    )
    assert w.engine.node_conditions() == [] and w.engine.gpus_missing() == 0
    assert w.engine.node_version == v0 + 3


def test_telemetry_and_latest_samples() -> None:
    w = World()
    w.samples(1, utilization_ratio=1.5, throttle_reasons=frozenset({"hw_slowdown"}))
    tel = w.gpu0.telemetry
    assert tel.utilization_ratio == 1.0 and tel.throttled and tel.temperature_c == 45.0
    assert set(w.engine.latest_samples()) == {U0}


def test_latched_survive_restart() -> None:
    w = World()
    w.xid(79, uuid=U0)
    saved = w.engine.latched()
    fresh = World()
    fresh.engine.restore_latched(saved)
    assert fresh.codes() == {"xid-79"} and fresh.gpu0.state == "unhealthy"


def test_operator_clear_lets_present_fault_come_back() -> None:
    w = World()
    w.samples(3, temperature_c=93.0)
    w.engine.clear(U0)
    assert w.codes() == set()
    w.samples(3, temperature_c=93.0)
    assert w.codes() == {"thermal"}


def test_escalation_disabled_by_setting() -> None:
    w = World(HealthSettings(app_xid_escalation_count=0))
    for _ in range(50):
        w.xid(13, uuid=U0, source="nvml")
    assert w.gpu0.state == "healthy"
    assert w.engine.xid_counts()[(U0, 13)] == 50


@pytest.mark.parametrize(
    ("driver_text", "message"),
    [
        ("GPU has fallen off the bus.", "GPU has fallen off the bus."),
        ("", "GPU has fallen off the bus"),
        ("pid=1234, name=python3", "GPU has fallen off the bus: pid=1234, name=python3"),
    ],
)
def test_xid_message_does_not_repeat_the_catalog_name(driver_text: str, message: str) -> None:
    w = World()
    w.xid(79, uuid=U0, msg=driver_text)
    (cond,) = w.gpu0.conditions
    assert cond.message == message


def test_the_first_fault_stays_first_when_a_later_one_joins() -> None:
    w = World()
    w.xid(79, uuid=U0)
    w.clock.advance(1)
    w.xid(62, uuid=U0)  # a later unhealthy condition whose code sorts before xid-79
    assert [c.code for c in w.gpu0.conditions] == ["xid-79", "xid-62"]


def test_an_xid_event_carries_the_lines_text() -> None:
    """XID 13's GPC, TPC and SM reach the controller (it names where a job's first fault
    happened); a plain transition carries none."""
    w = World()
    w.transitions.clear()
    text = "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Illegal Instruction Encoding"
    w.transitions += w.engine.observe(
        XidObservation(source="kmsg", xid=13, at=w.clock.now(), uuid=U0, message=text, pid=42)
    )
    (t,) = w.transitions
    assert t.kind == "xid" and t.detail == f"{text} (pid 42)"
    w.xid(79, uuid=U0)
    assert w.transitions[-1].xid == 79
