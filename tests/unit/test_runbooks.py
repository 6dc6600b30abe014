"""Every alert in deploy/prometheus/rules.yaml has a runbook with the sections on-call needs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
CHART_RULES = ROOT / "deploy" / "helm" / "gpuhealth" / "files" / "prometheus-rules.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks"
RUNBOOK_BASE_URL = "https://github.com/gpuhealth/gpuhealth/blob/main/docs/runbooks/"
REQUIRED_SECTIONS = (
    "Meaning",
    "Impact",
    "Diagnosis",
    "Remediation",
    "Clearing gpuhealth's verdict",
    "Escalation",
)
REQUIRED_ALERTS = {
    "GPUXidFatal",
    "GPUEccUncorrectable",
    "GPURowRemapFailure",
    "GPUFallenOffBus",
    "GPUMissing",
    "GPUThermalThrottling",
    "GPUNodeTainted",
    "GPUIdleAllocation",
    "GPUHealthAgentDown",
    "GPUHealthControllerNoLeader",
    "GPUHealthCircuitBreakerOpen",
    "GPUHealthStreamRejects",
}
SEVERITIES = {"critical", "warning", "info"}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def _gpu_alerts() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] if g["name"] == "gpuhealth-gpu" for r in g["rules"]}


ALERTS = {rule["alert"]: rule for rule in _rules()}


def _sections(text: str) -> dict[str, str]:
    """``## Heading`` -> body up to the next level-2 heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def test_required_alerts_exist() -> None:
    assert set(ALERTS) >= REQUIRED_ALERTS, REQUIRED_ALERTS - set(ALERTS)


def test_chart_copy_of_rules_is_identical() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), (
        "run: cp deploy/prometheus/rules.yaml deploy/helm/gpuhealth/files/prometheus-rules.yaml"
    )


def test_every_runbook_belongs_to_an_alert() -> None:
    pages = {p.stem for p in RUNBOOKS.glob("*.md") if p.name != "README.md"}
    assert pages == set(ALERTS)


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_metadata(alert: str) -> None:
    rule = ALERTS[alert]
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert annotations["summary"].strip()
    assert annotations["description"].strip()
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE_URL}{alert}.md"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_runbook_has_required_sections(alert: str) -> None:
    text = (RUNBOOKS / f"{alert}.md").read_text()
    assert text.startswith(f"# {alert}\n")
    sections = _sections(text)
    assert list(sections)[: len(REQUIRED_SECTIONS)] == list(REQUIRED_SECTIONS)
    for name in REQUIRED_SECTIONS:
        assert len(sections[name]) > 40, f"{alert}: section {name!r} is too thin"
    assert "kubectl " in sections["Diagnosis"]
    assert "nvidia-smi" in text


@pytest.mark.parametrize("alert", sorted(_gpu_alerts()))
def test_gpu_runbooks_diagnose_on_the_node(alert: str) -> None:
    diagnosis = _sections((RUNBOOKS / f"{alert}.md").read_text())["Diagnosis"]
    assert "nvidia-smi" in diagnosis
    assert "kubectl debug node/" in diagnosis or "kubectl get --raw" in diagnosis


def test_index_lists_every_alert_with_its_severity() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    for alert, rule in ALERTS.items():
        assert f"| {alert} | {rule['labels']['severity']} | [{alert}.md]({alert}.md) |" in index


def _documented_metrics() -> set[str]:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    names: set[str] = set()
    for line in doc.splitlines():
        if line.startswith("| `gpuhealth_"):
            names.update(re.findall(r"`(gpuhealth_[a-z0-9_]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_uses_documented_metrics(alert: str) -> None:
    used = set(re.findall(r"\bgpuhealth_[a-z0-9_]+", ALERTS[alert]["expr"]))
    assert used, f"{alert} uses no gpuhealth metric"
    assert used <= _documented_metrics(), used - _documented_metrics()
