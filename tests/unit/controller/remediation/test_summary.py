"""Episode rows for the status CLI and JSON for the status page."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.summary import (
    pipeline,
    remediation_json,
    row,
    rows,
    table,
    to_json,
)
from tests.fakes.remediation_world import World, fault_condition, node_facts
from tests.support.remediation import drive, finished, one_round, runner_for, settings


async def test_rows_table_json_and_pipeline() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(
        "node-a", unhealthy={0: fault_condition("xid-48", "RESET_GPU")}, allocations=None
    )
    w.nodes["node-b"] = node_facts(
        "node-b", unhealthy={0: fault_condition("row-remap-failure", "CONTACT_SUPPORT")}
    )
    r = runner_for(w, settings())
    await drive(
        w,
        r,
        lambda: any(e.node == "node-a" and e.status.times.returned for e in w.store.episodes()),
    )
    await one_round(w, r)
    now = w.clock.now() + timedelta(minutes=3)
    got = rows(w.store.episodes(), now)
    # in progress first, then waiting for a person (escalated), then returned
    assert [row[:3] for row in got] == [
        ("node-b", "Escalated", "escalate"),
        ("node-a", "Returned", "reset-gpu"),
    ]
    assert got[0][4] == "3m"  # escalated a little over 3 minutes ago
    doc = remediation_json(w.store.episodes(), now)
    assert doc["total"] == 2
    assert doc["pipeline"]["Escalated"] == 1 and doc["pipeline"]["Returned"] == 1
    assert set(doc["pipeline"]) == {p.value for p in Phase}
    b, a = doc["episodes"]
    assert (b["node"], b["phase"], b["reason"]) == ("node-b", "Escalated", "ContactSupport")
    assert 180.0 <= b["in_phase_s"] < 240.0 and b["age_s"] >= b["in_phase_s"]
    assert a["evicted"] == 0 and a["phase_since"] is not None
    text = table(doc["episodes"])
    head, first, second = text.splitlines()
    assert head.split()[:4] == ["NODE", "PHASE", "ACTION", "REASON"]
    assert first.split()[:5] == ["node-b", "Escalated", "escalate", "ContactSupport", "3m"]
    assert first.index("Escalated") == second.index("Returned") == head.index("PHASE")
    assert remediation_json(w.store.episodes(), now, limit=1)["episodes"] == [b]
    full = to_json(w.store.episodes())
    assert full[1]["spec"]["nodeName"] == "node-a" and full[1]["status"]["phase"] == "Returned"
    counts = pipeline(w.store.episodes())
    assert counts == doc["pipeline"]
    assert finished


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, ("?", "?", "?", "-", "-", "-", "0", "?")),
        (
            {"node": "n", "phase": "Draining", "action": "reboot", "reason": "",
             "in_phase_s": 7300.0, "age_s": "x", "evicted": 4, "name": "ep"},
            ("n", "Draining", "reboot", "-", "2h01m", "-", "4", "ep"),
        ),
        ({"in_phase_s": 90, "age_s": 600}, ("?", "?", "?", "-", "90s", "10m", "0", "?")),
    ],
)  # fmt: skip
def test_a_row_from_any_json(doc: dict[str, object], expected: tuple[str, ...]) -> None:
    assert row(doc) == expected
