"""Every metric family the controller exports is a row of docs/metrics.md's controller table, and
every row there is exported: the registry of a controller built with every optional part on
(remediation, the scheduler extender, idle tracking, DRA), rendered as Prometheus scrapes it."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.settings import load_config
from gpuhealth.protocol import Condition
from tests.support.fleet import connect

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
XID = Condition(reason="XidError", code="xid-79", severity="unhealthy")


def _documented() -> set[str]:
    controller_part = DOCS.read_text().split("## Controller", 1)[1]
    names: set[str] = set()
    for line in controller_part.splitlines():
        if line.startswith("| `gpuhealth_"):
            names.update(re.findall(r"`(gpuhealth_[a-z_]+)`", line.split("|")[1]))
    return names


async def _exported() -> set[str]:
    cfg = load_config(
        None,
        {
            "kubeconfig": "unused",
            "remediation": {"enabled": True},
            "extender": {"enabled": True},
            "idle": {"enabled": True},
            "dra": {"enabled": True},
        },
    )
    ctl = build_controller(cfg, None)  # type: ignore[arg-type]
    connect(ctl.parts.fleet, "n1", 1, faults={0: XID})
    text = generate_latest(ctl.parts.registry).decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        # The parser drops a counter's _total from the family name; the docs use the full name.
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    # prometheus_client's ``*_created`` timestamps are samples of their counter, not metrics.
    return {n for n in names if n.startswith("gpuhealth_") and not n.endswith("_created")}


async def test_the_table_and_the_registry_are_read() -> None:
    assert "gpuhealth_hard_writes_total" in _documented()
    assert {"gpuhealth_reconcile_total", "gpuhealth_nodes"} <= await _exported()


async def test_every_exported_controller_metric_is_documented() -> None:
    missing = sorted(await _exported() - _documented())
    assert not missing, f"controller metrics missing from docs/metrics.md: {missing}"


async def test_every_documented_controller_metric_is_exported() -> None:
    stale = sorted(_documented() - await _exported())
    assert not stale, f"docs/metrics.md lists controller metrics nothing exports: {stale}"
