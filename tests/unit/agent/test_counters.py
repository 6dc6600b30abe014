"""Every counter a part of the agent keeps is declared once and exported (and documented);
no part keeps a counter of its own on the side."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.exposition import render
from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.stats import AgentStats
from tests.support.agent import EveryPart, Tasks, engine_with, every_part
from tests.support.clock import FakeClock

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
SPECS = [spec for counters in every_part().all_counters() for spec in counters.specs]


def _exported(parts: EveryPart) -> dict[str, list[tuple[dict[str, str], float]]]:
    stats = AgentStats(Tasks({}))
    for counters in parts.all_counters():
        stats.add_counters(counters)
    state = NodeSnapshotCache("n", engine_with(0), FakeClock())  # type: ignore[arg-type]
    text = render(make_registry(state.snapshot, "t", stats)).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            out[fam.name + "_total"] = [(dict(s.labels), s.value) for s in fam.samples]
    return out


def test_the_parts_declare_the_counters_they_keep() -> None:
    names = {s.name for s in SPECS}
    assert len(names) == len(SPECS), "a counter name is declared twice"
    for want in (  # the counters that were once kept and never exported
        "kmsg_dropped_lines",
        "kmsg_overruns",
        "kmsg_xids",
        "held_xids",
        "held_xids_dropped",
        "nvml_field_errors",
        "nvml_events",
        "dcgm_scrapes",
        "sim_faults",
        "unmapped_xids",
        "duplicate_xids",
        "unknown_observations",
    ):
        assert want in names


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_declared_counter_is_exported_and_documented(spec: CounterSpec) -> None:
    name = f"gpuhealth_agent_{spec.name}_total"
    assert re.fullmatch(r"gpuhealth_agent_[a-z][a-z0-9_]*_total", name)
    exported = _exported(every_part())
    assert name in exported
    if spec.label is None:
        assert exported[name] == [({}, 0.0)]  # present before it ever moved
    assert f"`{name}`" in DOCS.read_text()


@pytest.mark.parametrize("spec", [s for s in SPECS if s.label is None], ids=lambda s: s.name)
def test_an_increment_shows_in_the_scrape(spec: CounterSpec) -> None:
    parts = every_part()
    owner = next(c for c in parts.all_counters() if spec in c.specs)
    owner.inc(spec, 3)
    assert _exported(parts)[f"gpuhealth_agent_{spec.name}_total"] == [({}, 3.0)]


def test_labelled_counters_are_split_by_their_label() -> None:
    from gpuhealth.agent.sources.nvml.source import NVML_CALL_TIMEOUTS

    parts = every_part()
    parts.nvml.counters.inc(NVML_CALL_TIMEOUTS, label="10")
    parts.nvml.counters.inc(NVML_CALL_TIMEOUTS, 2, label="2")
    got = _exported(parts)["gpuhealth_agent_nvml_call_timeouts_total"]
    assert got == [({"gpu": "2"}, 2.0), ({"gpu": "10"}, 1.0)]


def test_no_part_keeps_a_counter_on_the_side() -> None:
    parts = every_part()
    for part in [*parts.sources(), parts.engine, parts.driver]:
        loose = [k for k in vars(part) if k.endswith("_total")]
        assert loose == [], f"{type(part).__name__} keeps {loose}: declare them in its Counters"


def test_an_undeclared_counter_is_a_programming_error() -> None:
    counters = Counters(CounterSpec("a", "A."))
    with pytest.raises(KeyError):
        counters.inc(CounterSpec("b", "B."))
