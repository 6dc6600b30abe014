"""bench/results.json -> the README's markdown table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import main, markdown

REPORT = {
    "machine": {"platform": "Linux-6.1", "python": "3.11.2", "cpus": 2, "processor": "x86_64"},
    "generated": "2026-11-22T12:00:00Z",
    "results": [
        {"benchmark": "agent_xid", "metric": "xid_to_event_p50_seconds", "value": 0.0012,
         "min": 0.001, "max": 0.0031, "runs": 5,
         "unit": "s", "target": "<= 0.1", "met": True, "error": None},
        {"benchmark": "controller", "metric": "taints_per_second", "value": 250.0,
         "min": 240.0, "max": 1250.5, "runs": 3,
         "unit": "1/s", "target": ">= 500", "met": False, "error": None},
        {"benchmark": "broken", "metric": "a|b", "value": None, "runs": 0, "unit": "s",
         "target": "<= 1", "met": None, "error": "RuntimeError: no | kube"},
    ],
}  # fmt: skip


def test_table_rows_machine_and_summary() -> None:
    lines = markdown(REPORT).splitlines()
    assert lines[0] == (
        "Measured on x86_64, 2 CPUs, Python 3.11.2, Linux-6.1 at 2026-11-22T12:00:00Z."
    )
    assert lines[2] == "| Benchmark | Metric | Median | Min - max | Runs | Target | Met |"
    assert lines[4] == (
        "| agent_xid | `xid_to_event_p50_seconds` | 0.0012 s | 0.001 - 0.0031 | 5 "
        "| <= 0.1 s | yes |"
    )
    assert lines[5] == (
        "| controller | `taints_per_second` | 250 1/s | 240 - 1,250 | 3 | >= 500 1/s | **NO** |"
    )
    assert lines[6].startswith(
        "| broken | `a\\|b` | — | — | 0 | <= 1 s | n/a (RuntimeError: no \\| kube"
    )
    assert lines[-1].startswith("3 figures, 1 missing their target.")


def test_every_row_has_seven_cells() -> None:
    for line in markdown(REPORT).splitlines()[2:-2]:
        assert line.replace("\\|", "").count("|") == 8


def test_main_reads_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(REPORT))
    assert main(["--results", str(path)]) == 0
    assert "taints_per_second" in capsys.readouterr().out
    assert main(["--results", str(tmp_path / "missing.json")]) == 2


def test_rows_measured_separately_are_marked_with_their_date() -> None:
    merged = {
        **REPORT,
        "results": [
            *REPORT["results"],  # type: ignore[list-item]
            {"benchmark": "agent_kmsg", "metric": "idle_cpu", "value": 0.02, "min": 0.0,
             "max": 0.05, "runs": 2, "unit": "%", "target": "<= 0.2", "met": True,
             "error": None, "generated": "2026-11-23T10:00:00Z"},
        ],
    }  # fmt: skip
    lines = markdown(merged).splitlines()
    assert lines[7].startswith("| agent_kmsg † | `idle_cpu` |")
    assert lines[-1].endswith("at 2026-11-23T10:00:00Z.")
    assert not any("†" in line for line in markdown(REPORT).splitlines())


def test_merge_replaces_only_the_selected_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.__main__ as harness
    from bench.registry import Benchmark

    results = tmp_path / "results.json"
    results.write_text(json.dumps(REPORT))
    monkeypatch.setattr(harness, "RESULTS", results)
    new = {
        "machine": {"cpus": 2},
        "generated": "2026-11-23T10:00:00Z",
        "results": [{"benchmark": "controller", "metric": "taints_per_second", "value": 600.0}],
    }

    async def never() -> dict[str, float]:
        raise AssertionError

    merged = harness.merge(new, [Benchmark("controller", (), never)])
    rows = {r["benchmark"]: r for r in merged["results"]}
    assert rows["controller"]["value"] == 600.0
    assert rows["controller"]["generated"] == "2026-11-23T10:00:00Z"
    assert rows["agent_xid"] == REPORT["results"][0]  # type: ignore[index]
    assert merged["generated"] == REPORT["generated"]
