"""Every metric family the controller exports is a row of docs/metrics.md's controller table, and
every row there is exported: the ``/metrics`` of a controller built with every optional part on
(remediation, the scheduler extender, idle tracking, DRA), as Prometheus scrapes it."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.kube.node_view import NodeView
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
            "http": {"auth": {"reads": "open"}},  # no API server to review a token
            "remediation": {"enabled": True},
            "extender": {"enabled": True},
            "idle": {"enabled": True},
            "dra": {"enabled": True},
        },
    )
    ctl = build_controller(cfg, None)  # type: ignore[arg-type]
    connect(ctl.parts.fleet, "n1", 1, faults={0: XID})
    async with TestClient(TestServer(ctl.web_app())) as client:
        text = await (await client.get("/metrics")).text()
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


async def test_the_per_node_series_parse_as_prometheus_reads_them() -> None:
    """The per-node gauges, written without prometheus_client, are read back by its parser as
    the families and samples they were (a label value that needs escaping included)."""
    cfg = load_config(None, {"kubeconfig": "unused", "http": {"auth": {"reads": "open"}}})
    ctl = build_controller(cfg, None)  # type: ignore[arg-type]
    connect(ctl.parts.fleet, "n1", 1, faults={0: XID})
    connect(ctl.parts.fleet, "n0", 1)
    ctl.parts.fleet.on_disconnect("n0")
    ctl.parts.cache.update(
        NodeView(
            name="n1",
            resource_version="1",
            gpus=1,
            taints=(
                {
                    "key": "gpuhealth.io/unhealthy",
                    "value": 'xid-79 "a\\b"\n',
                    "effect": "NoSchedule",
                },
                {"key": "other.io/mine", "value": "x", "effect": "NoSchedule"},
            ),
        )
    )
    async with TestClient(TestServer(ctl.web_app())) as client:
        text = await (await client.get("/metrics")).text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    connected = families["gpuhealth_node_agent_connected"]
    assert connected.type == "gauge"
    assert [(s.labels, s.value) for s in connected.samples] == [
        ({"node": "n0"}, 0.0),
        ({"node": "n1"}, 1.0),
    ]
    tainted = families["gpuhealth_node_tainted"]
    assert [(s.labels, s.value) for s in tainted.samples] == [
        (
            {
                "effect": "NoSchedule",
                "key": "gpuhealth.io/unhealthy",
                "node": "n1",
                "reason": 'xid-79 "a\\b"\n',
            },
            1.0,
        )
    ]
