"""The alert rules pass ``promtool check rules`` and their ``promtool test rules`` unit tests,
and every alert has a test case where it fires and one where it stays silent."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.tooling import require

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "rules.yaml"
TEST_FILES = sorted((PROM_DIR / "tests").glob("*.yaml"))
PROMTOOL_TIMEOUT_S = 120


def _promtool() -> str:
    return require("promtool", hint="hack/system-deps.sh installs Debian's prometheus")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        cwd=ROOT,
        check=False,
    )


def _alert_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_check_rules() -> None:
    result = _run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in result.stdout


def test_chart_copy_passes_check_rules() -> None:
    chart_rules = ROOT / "deploy" / "helm" / "gpuhealth" / "files" / "prometheus-rules.yaml"
    result = _run("check", "rules", str(chart_rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    assert TEST_FILES
    result = _run("test", "rules", *(str(p) for p in TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for case in _cases():
        (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = _alert_names()
    assert alerts - fires == set(), "alerts with no case where they fire"
    assert alerts - silent == set(), "alerts with no case where they stay silent"


def test_promtool_catches_a_broken_expectation(tmp_path: Path) -> None:
    """The harness can fail: a test that expects the wrong severity must be reported."""
    source = yaml.safe_load((PROM_DIR / "tests" / "gpu_alerts_test.yaml").read_text())
    source["rule_files"] = [str(RULES)]
    for test in source["tests"]:
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts", []):
                alert["exp_labels"]["severity"] = "page-nobody"
    broken = tmp_path / "broken_test.yaml"
    broken.write_text(yaml.safe_dump(source))
    result = _run("test", "rules", str(broken))
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
