"""Scenario loader: valid files load, every error names the line and field, fuzzing only
ever yields ConfigError."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhealth.agent.sources.sim.scenario import load_scenario, parse_scenario
from gpuhealth.common.errors import ConfigError

EXAMPLES = sorted((Path(__file__).parents[5] / "examples" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_shipped_examples_load(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.faults and sc.gpus >= 1


def test_full_scenario() -> None:
    sc = parse_scenario(
        """
name: t
gpus: 4
poll_interval_s: 0.5
seed: 3
events:
  - {at: "2m", gpu: 1, temperature: 93, for: 90s}
  - {at: 1, gpu: 0, xid: 79, pid: 12, process: python3, message: bus}
  - {at: 5, gpu: all, reset: true}
  - {at: 6, gpu: 2, throttle: [hw_thermal, power_cap], for: 10}
"""
    )
    assert [e.kind for e in sc.faults] == ["xid", "reset", "throttle", "temperature"]
    assert sc.faults[-1].at_s == 120 and sc.faults[-1].duration_s == 90
    assert sc.faults[1].gpu is None
    assert sc.faults[0].line == 8
    assert sc.seed == 3 and sc.poll_interval_s == 0.5


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus: 2\nevents:\n  - {at: 1, gpu: 5, xid: 79}\n", ":3: events[0].gpu"),
        ("gpus: 2\nevents:\n  - at: 1\n    gpu: 0\n    xid: banana\n", ":5: events[0].xid"),
        ("events:\n  - {at: 1, gpu: 0}\n", ":2: events[0]: needs exactly one of"),
        ("events:\n  - {at: 1, gpu: 0, xid: 1, dbe: 2}\n", ":2: events[0]"),
        ("events:\n  - {gpu: 0, xid: 13}\n", ":2: events[0].at"),
        ("events:\n  - {at: 1, gpu: 0, temperature: 90}\n", "events[0].for: missing"),
        ("events:\n  - {at: 1, gpu: 0, xid: 13, for: 3}\n", "events[0].for: not allowed"),
        ("events:\n  - {at: soon, gpu: 0, xid: 13}\n", "events[0].at: expected seconds"),
        ("events:\n  - {at: 1, gpu: 0, row_remap: maybe}\n", "events[0].row_remap"),
        ("events:\n  - {at: 1, gpu: 0, throttle: [too_hot], for: 1}\n", "unknown throttle reason"),
        ("events:\n  - {at: 1, gpu: 0, xid: 13, colour: red}\n", "events[0].colour: unknown field"),
        ("gpus: 0\n", ":1: gpus"),
        ("gpus: 8\nbogus: 1\n", ":2: bogus: unknown field"),
        ("events: {a: 1}\n", ":1: events"),
        ("gpus: [1, 2\n", "invalid YAML"),
        ("", "empty scenario"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("events:\n  - {at: 1, gpu: 0, lost: false}\n", "events[0].lost: expected true"),
    ],
)
def test_errors_name_line_and_field(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_scenario(text, "s.yaml")
    assert needle in str(exc.value)
    assert str(exc.value).startswith("s.yaml")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_fuzz_text_only_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_scenario(text)


_scalar = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
_event = st.dictionaries(
    st.sampled_from(
        ["at", "gpu", "for", "xid", "dbe", "temperature", "throttle", "reset", "pid", "x"]
    ),
    st.one_of(_scalar, st.lists(_scalar, max_size=3)),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["gpus", "events", "seed", "model", "zzz"]),
        st.one_of(_scalar, st.lists(_event, max_size=4)),
        max_size=4,
    )
)
def test_fuzz_structured_only_config_error(doc: dict[str, object]) -> None:
    import yaml

    with contextlib.suppress(ConfigError):
        parse_scenario(yaml.safe_dump(doc))


def test_faults_is_the_list_and_events_its_older_name() -> None:
    for key in ("faults", "events"):
        sc = parse_scenario(f"gpus: 2\n{key}:\n  - {{at: 1, gpu: 1, xid: 79}}\n")
        assert [(f.gpu, f.value) for f in sc.faults] == [(1, 79)]
    with pytest.raises(ConfigError, match=r":3: events: give faults or"):
        parse_scenario("faults: []\ngpus: 1\nevents: []\n")
    with pytest.raises(ConfigError, match=r":3: faults\[0\]\.gpu"):
        parse_scenario("gpus: 2\nfaults:\n  - {at: 1, gpu: 5, xid: 79}\n")
