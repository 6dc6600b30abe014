"""NVSwitch errors (SXid) from the kernel log: every real line of tests/data/sxid_corpus.txt
parses to its code, switch, PCI address, severity and link, through the follower's own line
handling; XID lines are never SXids and the other way round; garbage never raises."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.observations import SxidObservation, XidObservation
from gpuhealth.agent.sources.kmsg.parser import parse_line, strip_prefix
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import (
    KMSG_MALFORMED,
    KMSG_MALFORMED_SXIDS,
    KMSG_SXIDS,
    KmsgSource,
)
from gpuhealth.agent.sources.kmsg.sxid import parse_sxid
from tests.support.clock import FakeClock
from tests.unit.agent.sources.kmsg.test_xid_corpus import CASES as XID_CASES

CORPUS = Path(__file__).resolve().parents[4] / "data" / "sxid_corpus.txt"


@dataclass(frozen=True)
class Case:
    sxid: int
    switch: int
    pci: str
    kind: str
    link: int | None
    line: str


def load() -> list[Case]:
    out = []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        sxid, switch, pci, kind, link, line = raw.split("\t", 5)
        out.append(
            Case(int(sxid), int(switch), pci, kind, None if link == "-" else int(link), line)
        )
    return out


CASES = load()


def source() -> KmsgSource:
    return KmsgSource("/dev/null", KmsgSettings(), FakeClock())


def test_the_corpus_has_every_kind() -> None:
    assert {c.kind for c in CASES} == {"F", "N", "D"}
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.line[:60])
def test_every_real_sxid_line_parses(case: Case) -> None:
    parsed = parse_sxid(strip_prefix(case.line))
    assert parsed is not None
    assert (parsed.sxid, parsed.switch, parsed.pci_bus_id) == (case.sxid, case.switch, case.pci)
    assert parsed.detail == (case.kind == "D")
    if case.kind != "D":
        assert parsed.fatal == (case.kind == "F")
        assert parsed.link == case.link
    assert parse_line(strip_prefix(case.line)) is None  # never an XID


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.line[:60])
def test_the_follower_reports_headlines_and_skips_detail_lines(case: Case) -> None:
    src = source()
    obs = src.observation(case.line)
    if case.kind == "D":
        assert obs is None
        assert src.counters.value(KMSG_SXIDS) == 0
    else:
        assert isinstance(obs, SxidObservation)
        assert (obs.sxid, obs.fatal, obs.switch, obs.link) == (
            case.sxid,
            case.kind == "F",
            case.switch,
            case.link,
        )
        assert src.counters.value(KMSG_SXIDS) == 1
    assert src.counters.value(KMSG_MALFORMED_SXIDS) == 0
    assert src.counters.value(KMSG_MALFORMED) == 0


@pytest.mark.parametrize("case", XID_CASES[:20], ids=lambda c: c.line[:50])
def test_xid_lines_are_never_sxids(case: object) -> None:
    line = case.line  # type: ignore[attr-defined]
    assert parse_sxid(strip_prefix(line)) is None
    assert isinstance(source().observation(line), XidObservation)


def test_a_broken_sxid_line_is_counted_not_raised() -> None:
    src = source()
    assert src.observation("nvidia-nvswitch0: SXid (PCI:zzzz): twelve, Fatal") is None
    assert src.counters.value(KMSG_MALFORMED_SXIDS) == 1


@given(st.text(max_size=300))
def test_the_parser_never_raises_on_garbage(text: str) -> None:
    for line in (text, f"nvidia-nvswitch0: SXid {text}", f"nvidia-nvswitch1: SXid (PCI:{text}"):
        parse_sxid(line)
        source().observation(line)


@given(
    code=st.integers(0, 999_999),
    switch=st.integers(0, 9999),
    dom=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    dev=st.integers(0, 0x1F),
    fatal=st.booleans(),
    link=st.none() | st.integers(0, 999),
    text=st.text(
        alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\r\n"),
        max_size=80,
    ),
)
def test_a_generated_headline_round_trips(
    code: int, switch: int, dom: int, bus: int, dev: int, fatal: bool, link: int | None, text: str
) -> None:
    severity = "Fatal" if fatal else "Non-fatal"
    where = f"Link {link} " if link is not None else ""
    body = text.strip()
    if body.startswith(("Severity", "Data {", "Link")):
        body = "x " + body
    line = (
        f"nvidia-nvswitch{switch}: SXid (PCI:{dom:04x}:{bus:02x}:{dev:02x}.0): "
        f"{code}, {severity}, {where}{body}"
    )
    parsed = parse_sxid(line)
    assert parsed is not None
    assert (parsed.sxid, parsed.switch, parsed.fatal, parsed.detail) == (code, switch, fatal, False)
    assert parsed.pci_bus_id == f"{dom:08X}:{bus:02X}:{dev:02X}.0"
    assert parsed.link == link
    assert parsed.message == body.strip()
