"""The simulator's NICs: a scenario's ``nics:`` and rail faults, and the ports it hands the
engine through the same observation (and rules) as the RDMA source's."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.rail_settings import RailSettings
from gpuhealth.agent.observations import NicObservation, Observation, PciAddress
from gpuhealth.agent.sources.sim.scenario import ScenarioNic, parse_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.errors import ConfigError
from tests.support.clock import FakeClock

SCENARIO = """
gpus: 4
nics:
  - {device: mlx5_0, gpus: [0, 1]}
  - {device: mlx5_bond_0, gpus: [2, 3], link_layer: Ethernet, rate: 200, model: MT4123}
faults:
  - {at: 5, nic: mlx5_0, rail_flap: 3, for: 6}
  - {at: 5, nic: mlx5_bond_0, rail_errors: 10, for: 20}
  - {at: 30, nic: mlx5_0, rail_down: true, for: 10}
  - {at: 50, nic: mlx5_bond_0, rail_rate: 100, for: 10}
"""


def test_nics_and_rail_faults_load() -> None:
    sc = parse_scenario(SCENARIO)
    assert sc.nics == (
        ScenarioNic(device="mlx5_0", gpus=(0, 1)),
        ScenarioNic(device="mlx5_bond_0", gpus=(2, 3), link_layer="Ethernet", rate_gbps=200.0,
                    model="MT4123"),
    )  # fmt: skip
    assert [(f.kind, f.nic, f.gpu, f.value) for f in sc.faults] == [
        ("rail_flap", "mlx5_0", None, 3),
        ("rail_errors", "mlx5_bond_0", None, 10.0),
        ("rail_down", "mlx5_0", None, True),
        ("rail_rate", "mlx5_bond_0", None, 100.0),
    ]


NIC = "nics:\n  - {device: mlx5_0, gpus: [0]}\nfaults:\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (NIC + "  - {at: 1, gpu: 0, rail_down: true, for: 1}\n",
         "faults[0].gpu: a rail fault names its nic"),
        (NIC + "  - {at: 1, rail_down: true, for: 1}\n", "faults[0].nic: missing"),
        (NIC + "  - {at: 1, nic: mlx5_9, rail_down: true, for: 1}\n", "no NIC 'mlx5_9'"),
        (NIC + "  - {at: 1, nic: mlx5_0, rail_flap: 2}\n", "faults[0].for: missing"),
        ("faults:\n  - {at: 1, gpu: 0, nic: mlx5_0, xid: 79}\n", "faults[0].nic: not allowed"),
        ("gpus: 2\nnics:\n  - {device: mlx5_0, gpus: [2]}\n", "nics[0].gpus"),
        ("nics:\n  - {device: mlx5_0}\n", "nics[0]: needs device and gpus"),
        ("nics:\n  - {device: mlx5_0, gpus: [0], colour: red}\n", "nics[0].colour: unknown"),
        ("nics:\n  - {device: mlx5_0, gpus: [0], link_layer: OmniPath}\n", "nics[0].link_layer"),
        ("nics:\n  - {device: a, gpus: [0]}\n  - {device: a, gpus: [1]}\n", "nics[1].device"),
        ("nics:\n  - {device: 'a b', gpus: [0]}\n", "nics[0].device"),
        ("nics: {device: a}\n", "nics: expected a list"),
    ],
)  # fmt: skip
def test_errors_name_line_and_field(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_scenario(text, "s.yaml")
    assert needle in str(exc.value)


_scalar = st.one_of(st.integers(-5, 300), st.text(max_size=8), st.booleans(), st.none())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["device", "gpus", "link_layer", "rate", "model", "x"]),
            st.one_of(_scalar, st.lists(_scalar, max_size=3)),
            max_size=5,
        ),
        max_size=3,
    ),
    st.lists(
        st.dictionaries(
            st.sampled_from(["at", "nic", "gpu", "for", "rail_flap", "rail_down", "rail_rate"]),
            _scalar,
            max_size=5,
        ),
        max_size=3,
    ),
)
def test_fuzzed_nics_only_config_error(nics: list[object], faults: list[object]) -> None:
    with contextlib.suppress(ConfigError):
        parse_scenario(yaml.safe_dump({"gpus": 4, "nics": nics, "faults": faults}))


def _play(
    seconds: int, rails: RailSettings | None = None
) -> tuple[SimSource, HealthEngine, list[NicObservation]]:
    clock = FakeClock()
    sim = SimSource(parse_scenario(SCENARIO), clock, seed=0)
    engine = HealthEngine(HealthSettings(), clock, rails)
    nics: list[NicObservation] = []

    def sink(obs: Observation) -> None:
        if isinstance(obs, NicObservation):
            nics.append(obs)
        engine.observe(obs)

    sink(sim.inventory())
    for t in range(seconds):
        sim.step(float(t), sink)
        engine.tick()
        clock.advance(1.0)
    return sim, engine, nics


def test_the_simulated_ports_pair_with_their_gpus() -> None:
    sim, _, nics = _play(1)
    (obs,) = nics
    assert obs.source == "sim"
    gpus = [PciAddress.parse(g.pci_bus_id) for g in sim.inventory().gpus]
    assert [(p.device, p.gpus, p.up) for p in obs.ports] == [
        ("mlx5_0", (gpus[0], gpus[1]), True),
        ("mlx5_bond_0", (gpus[2], gpus[3]), True),
    ]
    assert obs.ports[1].link_layer == "Ethernet" and obs.ports[1].netdev == "mlx5_bond_0-net"


def test_a_flapping_rail_and_rising_errors_degrade_their_gpus_only() -> None:
    _, engine, nics = _play(12)
    downed = [o.ports[0].counters["link_downed"] for o in nics]
    assert downed[4] == 0 and downed[-1] == 3  # three flaps from t=5 on
    assert sum(1 for o in nics if not o.ports[0].up) == 3  # each seen down by one poll
    states = {s.info.index: (s.state, {c.code for c in s.conditions}) for s in engine.statuses()}
    assert states == {
        0: ("degraded", {"rail-flapping"}),
        1: ("degraded", {"rail-flapping"}),
        2: ("degraded", {"rail-errors"}),
        3: ("degraded", {"rail-errors"}),
    }


def test_a_rail_down_and_a_slow_rate() -> None:
    """The bond is the node's only Ethernet port: its own rate is the most common, so only
    its model's setting makes 100 Gb/s too slow."""
    _, engine, nics = _play(55)
    assert [o.ports[0].port_state for o in nics[29:32]] == ["ACTIVE", "DOWN", "DOWN"]
    assert nics[52].ports[1].rate_gbps == 100.0
    codes = {s.info.index: {c.code for c in s.conditions} for s in engine.statuses()}
    assert "rail-down" in codes[0] and "rail-degraded-rate" not in codes[2]
    _, engine, _ = _play(55, RailSettings(expected_rate_gbps={"MT4123": 200.0}))
    codes = {s.info.index: {c.code for c in s.conditions} for s in engine.statuses()}
    assert "rail-degraded-rate" in codes[2] and "rail-degraded-rate" not in codes[0]
