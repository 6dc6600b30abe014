"""The rules table: every non-XID verdict once, every sample rule run the same way."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.rules import RECOVERY, SAMPLE_RULES, VERDICTS
from gpuhealth.agent.observations import FabricInfo, GpuIdentity, GpuSample, Inventory
from gpuhealth.protocol import HEALTH_STATES
from tests.support.clock import FakeClock

AGENT = Path(__file__).resolve().parents[4] / "src" / "gpuhealth" / "agent"
U = "GPU-0"


def test_every_verdict_is_one_row() -> None:
    assert all(code == v.code for code, v in VERDICTS.items())
    assert all(re.fullmatch(r"[a-z][a-z0-9-]{0,62}", code) for code in VERDICTS)
    assert all(re.fullmatch(r"[A-Z][A-Za-z]+", v.reason) for v in VERDICTS.values())
    assert {v.severity for v in VERDICTS.values()} <= set(HEALTH_STATES) - {"healthy", "unknown"}


def test_sample_rules_name_known_verdicts_once() -> None:
    codes = [r.verdict.code for r in SAMPLE_RULES]
    assert len(codes) == len(set(codes))
    for rule in SAMPLE_RULES:
        assert VERDICTS[rule.verdict.code] is rule.verdict
        assert (rule.counter is None) == (rule.window_s is None)


@pytest.mark.parametrize("code", sorted(VERDICTS))
def test_a_condition_code_is_written_once(code: str) -> None:
    """Decisions are data: no module spells a verdict's code but the rules table (the
    recovery-action codes are built from the recovery-action table's names: spelled nowhere)."""
    places = [
        p.relative_to(AGENT).as_posix()
        for p in AGENT.rglob("*.py")
        for _ in re.finditer(f'"{re.escape(code)}"', p.read_text())
    ]
    generated = {v.code for v in RECOVERY.values()}
    assert places == ([] if code in generated else ["health/rules.py"])


@pytest.mark.parametrize("rule", SAMPLE_RULES, ids=lambda r: r.verdict.code)
def test_a_sample_without_the_field_says_nothing(rule: object) -> None:
    empty = GpuSample(uuid=U, at=FakeClock().now())
    judge = rule.judge  # type: ignore[attr-defined]
    counter = rule.counter  # type: ignore[attr-defined]
    if counter is not None:
        assert counter(empty) is None
    else:
        assert judge(empty, HealthSettings(), 0) is None


@pytest.mark.parametrize("rule", SAMPLE_RULES, ids=lambda r: r.verdict.code)
def test_every_rule_raises_its_verdict_through_the_engine(rule: object) -> None:
    """Drive each rule with a sample that its judge calls bad, until its hysteresis raises."""
    verdict = rule.verdict  # type: ignore[attr-defined]
    s = HealthSettings(throttle_sustain_s=0.0, fabric_not_ready_s=1.0)
    clock = FakeClock()
    engine = HealthEngine(s, clock)
    engine.observe(
        Inventory(source="sim", gpus=(GpuIdentity(index=0, uuid=U, model="m", pci_bus_id="x"),))
    )
    bad = {
        "thermal": {"temperature_c": 91.0},
        "thermal-shutdown": {"temperature_c": 99.0},
        "thermal-throttle": {"throttle_reasons": frozenset({"hw_thermal"})},
        "ecc-sbe-rate": {"ecc_sbe_volatile": None},
        "row-remap-pending": {"row_remap_pending": True},
        "retired-pages-pending": {"retired_pages_pending": True},
        "row-remap-failure": {"row_remap_failure": True},
        "pcie-replays": {"pcie_replay_count": None},
        "nvlink-errors": {"nvlink_errors": None},
        "nvlink-down": {"nvlink_links_up": 17, "nvlink_links_total": 18},
        "reset-required": {"reset_required": True},
        "fabric-not-ready": {"fabric": FabricInfo(state="in-progress")},
        "fabric-degraded": {
            "fabric": FabricInfo(
                state="completed", cluster_uuid="c", health=frozenset({"route-unhealthy"})
            )
        },
        **{
            v.code: {"recovery_action": value if value >= 0 else 99}
            for value, v in RECOVERY.items()
        },
    }[verdict.code]
    counter_field = {
        "ecc-sbe-rate": "ecc_sbe_volatile",
        "pcie-replays": "pcie_replay_count",
        "nvlink-errors": "nvlink_errors",
    }.get(verdict.code)
    names = {f.name for f in fields(GpuSample)}
    for i in range(10):
        kw = dict(bad)
        if counter_field is not None:
            assert counter_field in names
            kw[counter_field] = i * 1000  # grows far past any threshold
        engine.observe(GpuSample(uuid=U, at=clock.now(), **kw))  # type: ignore[arg-type]
        clock.advance(1.0)
    (status,) = engine.statuses()
    cond = next(c for c in status.conditions if c.code == verdict.code)
    assert (cond.reason, cond.severity, cond.action) == (
        verdict.reason,
        verdict.severity,
        verdict.action,
    )
    assert status.state == verdict.severity
    assert isinstance(cond.message, str) and cond.message
