"""GPU Operational Events: the catalog's verdicts (table over the R615/R620 event shapes: every
category, known and unknown codes, each attribute) and the engine's one-occurrence rule (an
event and its legacy Xid, in either order, are one counted, one judged occurrence)."""

# ruff: noqa: E501  (table rows read best one per line)

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpuhealth.agent.health.engine import (
    DUPLICATE_OP_EVENTS,
    DUPLICATE_XIDS,
    OP_EVENT_OVERFLOWS,
    UNMAPPED_OP_EVENTS,
)
from gpuhealth.agent.health.op_event_catalog import (
    ATTRIBUTES,
    GROUP_ATTRIBUTES,
    classify_event,
    condition_code,
    driver_release,
    op_catalog,
    parse_op_catalog,
)
from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.health.xid_catalog import CatalogError
from gpuhealth.agent.observations import OperationalEventObservation, PciAddress
from tests.unit.agent.health.test_engine import U0, World

PCI = PciAddress.parse("00000000:1B:00.0")

FATAL, RECOVERABLE, CORRECTED, INFO = 40, 30, 20, 10
CATEGORIES = {
    "TIMEOUT": 1,
    "MEMORY_INTEGRITY_ERROR": 2,
    "INTERCONNECT_ERROR": 3,
    "CORRUPTION_DETECTED": 4,
    "SECURITY_ERROR": 5,
    "POWER_ERROR": 6,
    "THERMAL": 7,
}


@dataclass(frozen=True)
class Shape:
    name: str
    module: str
    code: int
    category: int
    severity: int
    handled: str
    health: str
    xid: int | None = None
    group: int = 0
    attributes: int = 0
    driver: int | None = None
    scope: str | None = "gpu"


SHAPES = [
    # Published R620 events, known by code.
    Shape("bus fallen off (xid 79)", "GPU-BUS", 0x0003, 3, FATAL, "code", "degraded", xid=79),
    Shape("ras sparing (xid 185)", "GPU-RAS", 0x003D, 2, RECOVERABLE, "code", "degraded", xid=185),
    Shape("pshc engaged", "GPU-PSHC", 0x0001, 6, INFO, "code", "healthy"),
    Shape("pshc disengaged", "GPU-PSHC", 0x0002, 6, INFO, "code", "healthy"),
    Shape("pshc lifetime low", "GPU-PSHC", 0x0003, 6, RECOVERABLE, "code", "degraded"),
    Shape("pshc lifetime exhausted", "GPU-PSHC", 0x0004, 6, FATAL, "code", "degraded"),
    Shape("pcie fatal timeout", "GPU-PCIE", 0x0001, 3, FATAL, "code", "degraded"),
    Shape("pcie correctable", "GPU-PCIE", 0x0002, 3, CORRECTED, "code", "healthy"),
    Shape("pcie reset failure", "GPU-PCIE", 0x0003, 3, FATAL, "code", "degraded"),
    # Published ranges without a per-code table (SRAM ECC, LTC, poison, NVLink units): by category.
    Shape("ras sram ecc (fatal)", "GPU-RAS", 0x0030, 2, FATAL, "category", "degraded"),
    Shape("ras sram ecc (corrected)", "GPU-RAS", 0x0031, 2, CORRECTED, "category", "healthy"),
    Shape("nvlink unit error", "GPU-NVLINK", 0x0009, 3, FATAL, "category", "degraded"),
    Shape("secure nvlink", "GPU-NVLINK-SEC", 0x0004, 5, RECOVERABLE, "category", "degraded"),
    # Every category alone, unknown module and code.
    *[
        Shape(
            f"unknown code, {name}", "GPU-NEW", 0x0777, value, RECOVERABLE, "category", "degraded"
        )
        for name, value in CATEGORIES.items()
    ],
    Shape("unknown category", "GPU-NEW", 0x0001, 0x0042, FATAL, "category", "degraded"),
    Shape("unknown severity value", "GPU-NEW", 0x0001, 1, 35, "category", "degraded"),
    Shape("informational stays healthy", "GPU-NEW", 0x0001, 1, INFO, "category", "healthy"),
    # Group attributes: counted, never judged.
    Shape("simulated", "GPU-PSHC", 0x0004, 6, FATAL, "code", "healthy", group=1 << 2),
    Shape("recovered", "GPU-RAS", 0x0030, 2, FATAL, "category", "healthy", group=1 << 0),
    Shape("previous error", "GPU-RAS", 0x0030, 2, FATAL, "category", "healthy", group=1 << 1),
    # R615 does not publish the R620 codes: the same event is judged by its category there.
    Shape("pshc on R615", "GPU-PSHC", 0x0003, 6, RECOVERABLE, "category", "degraded", driver=615),
    Shape(
        "pcie correctable on R615",
        "GPU-PCIE",
        0x0002,
        3,
        CORRECTED,
        "category",
        "healthy",
        driver=615,
    ),
    # Per-event attributes do not change the verdict of a preview field (noted only).
    *[
        Shape(
            f"attribute {name}", "GPU-NEW", 0x0010, 2, FATAL, "category", "degraded", attributes=bit
        )
        for bit, name in ATTRIBUTES
    ],
]


@pytest.mark.parametrize("s", SHAPES, ids=lambda s: s.name)
def test_event_verdict(s: Shape) -> None:
    v = classify_event(
        s.module,
        s.code,
        s.category,
        s.severity,
        attributes=s.attributes,
        group_attributes=s.group,
        driver=s.driver,
    )
    assert v.handled == s.handled
    assert v.severity == s.health
    assert v.legacy_xid == s.xid
    assert v.scope == s.scope
    assert v.severity != "unhealthy"  # never a hard taint on a preview field alone
    assert v.condition_code == condition_code(s.module, s.code)
    if v.severity == "healthy":
        assert v.action == "NONE"
    for bit, name in ATTRIBUTES:
        assert (name in v.attributes) == bool(s.attributes & bit)
        if s.attributes & bit:
            assert name in v.message
    for bit, name in GROUP_ATTRIBUTES:
        assert (name in v.group) == bool(s.group & bit)
    assert v.judged == (s.group == 0)


def test_unnamed_attribute_bits_are_kept() -> None:
    v = classify_event("GPU-NEW", 1, 1, FATAL, attributes=1 << 9, group_attributes=1 << 5)
    assert "bit9" in v.attributes and "bit5" in v.group


def test_scope_values() -> None:
    """The MIG scopes' values are read off the subscription enum (inferred): named in the
    message, never put on the condition (it would narrow it); an unlisted value is the GPU's."""
    for raw, name in ((1, "gpu-instance"), (2, "compute-instance")):
        v = classify_event("GPU-RAS", 0x30, 2, FATAL, scope=raw)
        assert (v.scope, v.scope_name) == (None, name)
        assert f"scope {name} (raw {raw}, unconfirmed" in v.message
    device = classify_event("GPU-RAS", 0x30, 2, FATAL, scope=0)
    assert (device.scope, device.scope_name) == ("gpu", "gpu")
    odd = classify_event("GPU-RAS", 0x30, 2, FATAL, scope=9)
    assert odd.scope == "gpu" and "raw 9" in odd.message


def test_a_published_scope_would_narrow() -> None:
    """Once a release publishes the values, the catalog row says so and the scope goes on."""
    from importlib import resources

    text = resources.files("gpuhealth.agent.health").joinpath("op_event_catalog.yaml").read_text()
    row = "{value: 1, name: gpu-instance, basis: inferred}"
    assert row in text
    cat = parse_op_catalog(text.replace(row, row.replace("inferred", "published")))
    assert cat.scopes[1].confirmed and not cat.scopes[2].confirmed


def test_driver_release() -> None:
    assert driver_release("620.12.03") == 620
    assert driver_release("580.95.05") == 580
    assert driver_release(None) is None
    assert driver_release("weird") is None


def test_catalog_rows_are_consistent() -> None:
    cat = op_catalog()
    assert set(CATEGORIES) == set(cat.by_name)
    assert cat.releases == (615, 620)
    for row in cat.events.values():
        assert row.basis  # every fact says how sure it is
        assert row.xid is not None or row.severity is not None


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        (("GPU-PSHC, code: 0x0003", "GPU-PSHC, code: 0x0004"), "duplicate"),
        (("category: POWER_ERROR, severity: degraded", "category: NOPE, severity: degraded"), "category"),
        (("severity: degraded, action: RESTART_BM", "severity: unhealthy, action: RESTART_BM"), "preview_cap"),
        (("severity: healthy, action: NONE, basis: \"published range; code order inferred\"}\n  - {module: GPU-PCIE, code: 0x0003", "action: NONE, basis: \"x\"}\n  - {module: GPU-PCIE, code: 0x0003"), "legacy xid or a severity"),
        (("preview_cap: degraded", "preview_cap: broken"), "severity"),
    ],
)  # fmt: skip
def test_broken_catalog(patch: tuple[str, str], problem: str) -> None:
    from importlib import resources

    text = resources.files("gpuhealth.agent.health").joinpath("op_event_catalog.yaml").read_text()
    assert patch[0] in text
    with pytest.raises(CatalogError, match=problem):
        parse_op_catalog(text.replace(patch[0], patch[1], 1))


# ----------------------------------------------------------------- engine


def goe(w: World, **kw: Any) -> None:
    fields: dict[str, Any] = {
        "source": "nvml",
        "at": w.clock.now(),
        "uuid": U0,
        "module": "GPU-BUS",
        "code": 0x0003,
        "category": 3,
        "severity": FATAL,
        "legacy_xid": 79,
        "attributes": 1 << 5,
    }
    fields.update(kw)
    w.transitions += w.engine.observe(OperationalEventObservation(**fields))


def xid79(w: World) -> dict[str, Any]:
    return {c.code: c for c in w.gpu0.conditions}


@pytest.mark.parametrize(
    "order",
    [("goe", "kmsg"), ("kmsg", "goe"), ("nvml", "goe", "kmsg"), ("goe", "nvml", "kmsg"),
     ("kmsg", "nvml", "goe"), ("dcgm", "goe")],
    ids="-".join,
)  # fmt: skip
def test_event_and_legacy_xid_are_one_occurrence(order: tuple[str, ...]) -> None:
    w = World()
    for i, path in enumerate(order):
        if i:
            w.clock.advance(1.5)
        if path == "goe":
            goe(w, scope=0)
        else:
            w.xid(79, source=path, pci=PCI)
    conds = xid79(w)
    assert set(conds) == {"xid-79"}
    c = conds["xid-79"]
    assert c.severity == "unhealthy" and c.action == "RESTART_BM"  # the stable XID verdict
    assert c.scope == "gpu"  # the structured record's facts, whichever came first
    assert "GPU-BUS 0x0003" in c.message and "primary" in c.message
    assert w.engine.xid_counts() == {(U0, 79): 1}
    assert w.engine.counters.value(DUPLICATE_XIDS) == len(order) - 1
    assert w.engine.op_event_counts() == {(U0, "GPU-BUS", 3, "INTERCONNECT_ERROR", "code"): 1}


def test_outside_the_window_two_occurrences() -> None:
    w = World(HealthSettings(operational_event_window_s=5.0))
    goe(w)
    w.clock.advance(6.0)
    w.xid(79, source="kmsg", pci=PCI)
    assert w.engine.xid_counts() == {(U0, 79): 2}


def test_simulated_event_suppresses_its_xid_either_order() -> None:
    w = World()
    goe(w, group_attributes=1 << 2)
    w.clock.advance(1.0)
    w.xid(79, source="kmsg", pci=PCI)
    assert "xid-79" not in xid79(w)
    w2 = World()
    w2.xid(79, source="kmsg", pci=PCI)
    assert "xid-79" in xid79(w2)
    w2.clock.advance(1.0)
    goe(w2, group_attributes=1 << 2)
    assert "xid-79" not in xid79(w2)
    assert w2.gpu0.state == "healthy"


def test_event_without_xid_by_category_and_by_code() -> None:
    w = World()
    goe(w, module="GPU-RAS", code=0x0030, category=2, severity=FATAL, legacy_xid=None)
    c = xid79(w)["goe-gpu-ras-0x0030"]
    assert (c.reason, c.severity, c.action, c.scope) == (
        "UnknownOperationalEvent", "degraded", "RESET_GPU", "gpu"
    )  # fmt: skip
    goe(w, module="GPU-PSHC", code=0x0004, category=6, severity=FATAL, legacy_xid=None)
    assert xid79(w)["goe-gpu-pshc-0x0004"].reason == "OperationalEvent"
    goe(w, module="GPU-PSHC", code=0x0001, category=6, severity=INFO, legacy_xid=None)
    assert "goe-gpu-pshc-0x0001" not in xid79(w)  # counted, healthy
    assert w.gpu0.state == "degraded"
    counts = w.engine.op_event_counts()
    assert counts[(U0, "GPU-PSHC", 1, "POWER_ERROR", "code")] == 1
    assert counts[(U0, "GPU-RAS", 0x30, "MEMORY_INTEGRITY_ERROR", "category")] == 1


def test_group_cursor_dedupes_cper_replay_and_overflow_is_counted() -> None:
    w = World()
    base = {"module": "GPU-RAS", "code": 0x30, "category": 2, "legacy_xid": None}
    goe(w, group_cursor=77, attributes=1 << 6, **base)
    goe(w, group_cursor=77, via="cper", **base)
    goe(w, group_cursor=78, via="cper", **base)
    assert w.engine.counters.value(DUPLICATE_OP_EVENTS) == 1
    assert w.engine.counters.value(OP_EVENT_OVERFLOWS) == 1
    assert (
        w.engine.op_event_counts()[(U0, "GPU-RAS", 0x30, "MEMORY_INTEGRITY_ERROR", "category")] == 2
    )


def test_a_group_is_one_report_whichever_path_brings_it_first() -> None:
    """NVML delivers each event of a group; a CPER record holds the group, one decoded section
    per event, or (undecoded) the whole group as one report of module CPER."""
    w = World()
    ras = {"module": "GPU-RAS", "category": 2, "legacy_xid": None}
    undecoded = {"module": "CPER", "code": 0, "category": 0, "legacy_xid": None}
    goe(w, group_cursor=90, via="cper", decoded=False, **undecoded)  # read back first
    goe(w, group_cursor=90, code=0x30, **ras)  # then live: the same group
    goe(w, group_cursor=91, code=0x30, **ras)  # live first
    goe(w, group_cursor=91, via="cper", decoded=False, **undecoded)
    goe(w, group_cursor=92, code=0x30, **ras)  # live, two events of one group
    goe(w, group_cursor=92, code=0x31, via="cper", **ras)  # the other event, decoded: new
    goe(w, group_cursor=92, code=0x30, via="cper", **ras)  # the first again: duplicate
    assert w.engine.counters.value(DUPLICATE_OP_EVENTS) == 3
    counts = w.engine.op_event_counts()
    assert counts[(U0, "GPU-RAS", 0x30, "MEMORY_INTEGRITY_ERROR", "category")] == 2
    assert counts[(U0, "GPU-RAS", 0x31, "MEMORY_INTEGRITY_ERROR", "category")] == 1


def test_unmapped_event_is_counted_not_attributed() -> None:
    w = World()
    goe(w, uuid=None)
    assert w.engine.counters.value(UNMAPPED_OP_EVENTS) == 1
    assert "xid-79" not in xid79(w)


def test_reset_clears_event_verdicts() -> None:
    from gpuhealth.agent.observations import ResetObservation

    w = World()
    goe(w, module="GPU-RAS", code=0x0030, category=2, legacy_xid=None)
    assert w.gpu0.state == "degraded"
    w.engine.observe(ResetObservation(source="nvml", at=w.clock.now(), uuid=U0))
    w.samples(1)
    assert w.gpu0.state == "healthy"


def test_structured_scope_survives_a_refining_kernel_line() -> None:
    w = World()
    goe(w, module="GPU-NEW", code=1, category=3, legacy_xid=154, scope=0)
    w.clock.advance(0.5)
    w.xid(
        154,
        source="kmsg",
        msg="GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        pci=PCI,
    )
    c = xid79(w)["xid-154"]
    assert c.action == "RESET_GPU" and c.scope == "gpu"
    _ = replace  # keep the import used across edits
