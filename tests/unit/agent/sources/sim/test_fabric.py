"""The simulator's NVLink fabric: GPUs of a scenario's domain report it, its faults drive the
engine's fabric verdicts, and an ``sxid`` fault is a fatal NVSwitch error of the node."""

from __future__ import annotations

import pytest

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import GpuSample, Observation, SxidObservation
from gpuhealth.agent.sources.sim.scenario import parse_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.errors import ConfigError
from tests.support.clock import FakeClock

DOMAIN = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
SCENARIO = f"""
gpus: 4
fabric: {DOMAIN}
faults:
  - {{at: 10, gpu: 1, fabric_health: [route-unhealthy], for: 60}}
  - {{at: 10, gpu: 2, fabric_state: in-progress, for: 600}}
  - {{at: 20, gpu: 0, sxid: 24007, message: "Link 28 sourcetrack timeout error"}}
"""


def test_members_report_the_domain_and_faults_become_verdicts() -> None:
    clock = FakeClock()
    sim = SimSource(parse_scenario(SCENARIO), clock, seed=1)
    engine = HealthEngine(HealthSettings(fabric_not_ready_s=30.0, flag_confirm_samples=2), clock)
    engine.observe(sim.inventory())
    seen: list[Observation] = []
    for t in range(0, 60):
        out: list[Observation] = []
        sim.step(float(t), out.append)
        for o in out:
            engine.observe(o)
        seen += out
        clock.advance(1.0)
    first = [o for o in seen if isinstance(o, GpuSample)][:4]
    assert all(s.fabric is not None and s.fabric.domain == DOMAIN for s in first)
    by_index = {s.info.index: s for s in engine.statuses()}
    assert {c.code for c in by_index[1].conditions} == {"fabric-degraded"}
    assert {c.code for c in by_index[2].conditions} == {"fabric-not-ready"}
    assert by_index[0].conditions == [] and by_index[3].conditions == []
    (sx,) = [o for o in seen if isinstance(o, SxidObservation)]
    assert (sx.sxid, sx.fatal) == (24007, True)
    assert [c.code for c in engine.node_conditions()] == ["nvswitch-fatal"]


def test_without_a_domain_the_gpus_report_no_fabric() -> None:
    sim = SimSource(parse_scenario("gpus: 2"), FakeClock(), seed=1)
    out: list[Observation] = []
    sim.step(0.0, out.append)
    assert all(o.fabric is None for o in out if isinstance(o, GpuSample))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("fabric: not-a-domain", "expected <clusterUUID>.<cliqueId>"),
        ("faults:\n  - {at: 1, gpu: 0, fabric_state: completed, for: 5}", "expected one of"),
        ("faults:\n  - {at: 1, gpu: 0, fabric_health: [bogus], for: 5}", "unknown fabric"),
        ("faults:\n  - {at: 1, gpu: 0, fabric_health: [route-recovery]}", "needs a duration"),
        ("faults:\n  - {at: 1, gpu: 0, sxid: 0}", "between 1 and"),
    ],
)
def test_bad_fabric_scenarios_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_scenario(text)
