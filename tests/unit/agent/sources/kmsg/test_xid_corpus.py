"""Every real-world Xid line of tests/data/xid_corpus.txt reaches the engine as an XID of the
right GPU (and MIG instance): through the follower's own line handling, none dropped."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhealth.agent.health.xid_catalog import classify
from gpuhealth.agent.observations import Observation, PciAddress, XidObservation
from gpuhealth.agent.sources.kmsg.parser import parse_line, strip_prefix
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import KMSG_MALFORMED, KMSG_XIDS, KmsgSource
from tests.support.clock import FakeClock

CORPUS = Path(__file__).resolve().parents[4] / "data" / "xid_corpus.txt"


@dataclass(frozen=True)
class Case:
    xid: int
    pci: str
    gpu_instance: int | None
    compute_instance: int | None
    line: str


def _opt(v: str) -> int | None:
    return None if v == "-" else int(v)


def load() -> tuple[list[Case], list[str]]:
    """(the XID lines, the real lines that are not XIDs)."""
    cases = []
    others = []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        xid, pci, gi, ci, line = raw.split("\t", 4)
        if xid == "-":
            others.append(line)
        else:
            cases.append(Case(int(xid), pci, _opt(gi), _opt(ci), line))
    return cases, others


CASES, NOT_XIDS = load()


def test_the_corpus_is_large_and_distinct() -> None:
    assert len(CASES) >= 60
    assert len({c.line for c in CASES}) == len(CASES)
    assert sum(c.gpu_instance is not None for c in CASES) >= 5  # MIG forms
    assert {144, 145, 146, 147, 148, 149, 150} <= {c.xid for c in CASES}  # NVLink5 forms


@pytest.mark.parametrize("line", NOT_XIDS, ids=lambda line: line[:50])
def test_an_nvswitch_sxid_is_never_read_as_an_xid(line: str) -> None:
    src = KmsgSource("/x", KmsgSettings(), FakeClock())
    out: list[Observation] = []
    assert parse_line(strip_prefix(line)) is None
    src.handle_line(line, out.append)
    assert not [o for o in out if isinstance(o, XidObservation)]  # an SXid, never an XID
    assert src.counters.value(KMSG_MALFORMED) == 0


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if re.search(r"\d+, \S+ +Non-?fatal ", c.line)],
    ids=lambda c: c.line[-60:],
)
def test_a_line_the_driver_calls_nonfatal_never_gets_a_hard_verdict(case: Case) -> None:
    p = parse_line(strip_prefix(case.line))
    assert p is not None
    assert classify(p.xid, p.message).severity != "unhealthy"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"xid{c.xid}-{c.line[:40]}")
def test_every_line_parses(case: Case) -> None:
    p = parse_line(strip_prefix(case.line))
    assert p is not None, case.line
    assert (p.xid, p.pci_bus_id, p.gpu_instance, p.compute_instance) == (
        case.xid,
        case.pci,
        case.gpu_instance,
        case.compute_instance,
    )


def test_the_follower_reports_every_line_for_its_gpu() -> None:
    src = KmsgSource("/x", KmsgSettings(), FakeClock())
    out: list[Observation] = []
    for c in CASES:
        src.handle_line(c.line, out.append)
    got = [
        (o.xid, o.uuid, o.pci, o.gpu_instance, o.compute_instance)
        for o in out
        if isinstance(o, XidObservation)
    ]
    # the address only: the health engine maps it to its GPU
    assert got == [
        (c.xid, None, PciAddress.parse(c.pci), c.gpu_instance, c.compute_instance) for c in CASES
    ]
    assert src.counters.value(KMSG_XIDS) == len(CASES)
    assert src.counters.value(KMSG_MALFORMED) == 0
