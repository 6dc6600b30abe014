"""The chart's dcgm-exporter counters CSV feeds every rule, in a form dcgm-exporter accepts."""

from __future__ import annotations

import csv
from pathlib import Path

from gpuhealth.agent.sources.dcgm.fields import FIELDS, RULE_FIELDS

ROOT = Path(__file__).resolve().parents[5]
CSV = ROOT / "deploy/helm/gpuhealth/files/dcgm-exporter/gpuhealth-counters.csv"
KNOWN = ROOT / "tests/data/dcgm_fields.txt"


def _known() -> dict[str, int]:
    """DCGM field name -> field id, from dcgm_fields.h (tests/data/dcgm_fields.txt)."""
    out = {}
    for line in KNOWN.read_text().splitlines():
        if line and not line.startswith("#"):
            name, fid = line.split()
            out[name] = int(fid)
    return out


def _records() -> list[list[str]]:
    """The CSV as dcgm-exporter reads it: Go's encoding/csv with Comment '#', each field
    trimmed of spaces, exactly three fields per record (else it refuses to start)."""
    rows = []
    with CSV.open(newline="") as f:
        for row in csv.reader(line for line in f if not line.startswith("#")):
            if row:
                rows.append([c.strip(" ") for c in row])
    return rows


def test_every_record_is_a_dcgm_field_with_a_type_and_help() -> None:
    known = _known()
    rows = _records()
    assert rows
    for row in rows:
        assert len(row) == 3, row  # a comma in the help text would break dcgm-exporter
        name, kind, help_ = row
        assert name in known, f"{name} is not a field of dcgm_fields.h"
        assert kind in {"gauge", "counter", "label"}, row
        assert help_ and '"' not in help_


def test_no_field_is_watched_twice() -> None:
    known = _known()
    ids = [known[name] for name, _, _ in _records()]
    assert len(ids) == len(set(ids))  # e.g. CLOCK_THROTTLE_REASONS and CLOCKS_EVENT_REASONS


def test_every_field_the_agent_reads_is_served() -> None:
    known = _known()
    served = {known[name] for name, _, _ in _records()}
    missing = [name for name in FIELDS if known[name] not in served]
    assert missing == []


def test_no_rule_is_left_blind() -> None:
    names = {name for name, _, _ in _records()}
    assert [r for r, fields in RULE_FIELDS.items() if not names & set(fields)] == []


def test_the_agent_reads_only_real_dcgm_fields() -> None:
    assert set(FIELDS) - set(_known()) == set()


def test_the_field_list_names_its_source() -> None:
    head = KNOWN.read_text().splitlines()[:5]
    assert any("github.com/NVIDIA/DCGM/blob/" in line and "dcgm_fields.h" in line for line in head)
