"""Simulator scenarios raise GPU Operational Events (``operational_event``), judged like
NVML's: by catalog row, by category, with the legacy Xid of a known event."""

# ruff: noqa: E501

from __future__ import annotations

import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import Observation, OperationalEventObservation
from gpuhealth.agent.sources.sim.scenario import parse_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.errors import ConfigError
from tests.support.clock import FakeClock

SCENARIO = """
gpus: 4
faults:
  - {at: 1, gpu: 0, operational_event: "GPU-PSHC 0x0004 severity=FATAL"}
  - {at: 1, gpu: 1, operational_event: "GPU-RAS 0x0030 category=MEMORY_INTEGRITY_ERROR severity=FATAL attrs=primary,uncontained"}
  - {at: 1, gpu: 2, operational_event: "GPU-BUS 0x0003"}
  - {at: 1, gpu: 3, operational_event: "GPU-RAS 0x0031 category=2 group=simulated"}
"""


def test_scenario_events_reach_their_verdicts() -> None:
    clock = FakeClock()
    sim = SimSource(parse_scenario(SCENARIO), clock, 1)
    engine = HealthEngine(HealthSettings(), clock)
    got: list[Observation] = []
    engine.observe(sim.inventory())
    sim.step(0.0, engine.observe)
    sim.step(1.0, got.append)
    for o in got:
        engine.observe(o)
    ops = [o for o in got if isinstance(o, OperationalEventObservation)]
    assert [o.module for o in ops] == ["GPU-PSHC", "GPU-RAS", "GPU-BUS", "GPU-RAS"]
    assert ops[2].legacy_xid == 79 and ops[2].category == 3  # from the catalog row
    assert ops[1].attributes == 0b100001
    by_gpu = {s.info.index: s for s in engine.statuses()}
    # The simulator reports driver 570: R620's codes are judged by their category there.
    assert [(c.code, c.reason) for c in by_gpu[0].conditions] == [
        ("goe-gpu-pshc-0x0004", "UnknownOperationalEvent")
    ]
    assert "POWER_ERROR" in by_gpu[0].conditions[0].message
    assert [(c.code, c.reason) for c in by_gpu[1].conditions] == [
        ("goe-gpu-ras-0x0030", "UnknownOperationalEvent")
    ]
    assert [c.code for c in by_gpu[2].conditions] == ["xid-79"]
    assert by_gpu[2].state == "unhealthy" and by_gpu[1].state == "degraded"
    assert by_gpu[3].conditions == [] and by_gpu[3].state == "healthy"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("GPU-PSHC", "expected"),
        ("GPU-PSHC zz", "code"),
        ("GPU-PSHC 1 foo=2", "key=value"),
        ("GPU-PSHC 1 attrs=bogus", "attribute"),
        ("GPU-PSHC 1 group=bogus", "group attribute"),
        ("GPU-PSHC 1 severity=LOUD", "severity"),
        ("GPU-PSHC 1 category=NOPE", "category"),
        ("GPU-VERY-LONG-MODULE-NAME 1", "16 characters"),
    ],
)
def test_bad_specs_name_the_field(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as err:
        parse_scenario(f'faults:\n  - {{at: 1, gpu: 0, operational_event: "{text}"}}\n')
    assert "faults[0].operational_event" in str(err.value)
