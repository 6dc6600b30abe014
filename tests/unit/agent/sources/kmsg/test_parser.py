"""The kernel's NVRM Xid line: formats of several driver generations, prefixes, garbage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.sources.kmsg.parser import line_wall_time, parse_line, strip_prefix

PCI = "00000000:1B:00.0"


@pytest.mark.parametrize(
    ("line", "xid", "pci", "pid", "name", "msg"),
    [
        (
            "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            79,
            PCI,
            1234,
            "python3",
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",  # noqa: E501
            79,
            PCI,
            None,
            "<unknown>",
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=88, Graphics SM Warp Exception on (GPC 0, TPC 1)",
            13,
            "00000000:3B:00.0",
            88,
            None,
            "Graphics SM Warp Exception on (GPC 0, TPC 1)",
        ),
        (
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",  # noqa: E501
            63,
            "00000000:10:1C.0",
            1896,
            None,
            "Row Remapper: New row marked for remapping, reset gpu to activate.",
        ),
        (
            "NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120",
            31,
            "00000000:01:00.0",
            None,
            None,
            "Ch 0000000b, engmask 00000120",
        ),
        ("NVRM: Xid (PCI:0001:c1:00.1): 48, DBE", 48, "00000001:C1:00.1", None, None, "DBE"),
        ("NVRM: Xid (PCI:0000:5a:00): 79", 79, "00000000:5A:00.0", None, None, ""),
        (
            "NVRM: Xid (PCI:0000:5a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",  # noqa: E501
            154,
            "00000000:5A:00.0",
            None,
            None,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        ),
    ],
)
def test_parse(line: str, xid: int, pci: str, pid: int | None, name: str | None, msg: str) -> None:
    p = parse_line(line)
    assert p is not None
    assert (p.xid, p.pci_bus_id, p.pid, p.process_name, p.message) == (xid, pci, pid, name, msg)


@pytest.mark.parametrize(
    ("line", "gi", "ci"),
    [
        ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE (0x9)", 5, None),
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:13 GPU-CI:02): 43, pid=1, name=p, Ch 9", 13, 2),
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:00 GPU-CI:00): 63, pid=12345, name=python, x", 0, 0),
        ("NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=p, Ch 9", None, None),
    ],
)
def test_mig_instances(line: str, gi: int | None, ci: int | None) -> None:
    p = parse_line(line)
    assert p is not None and p.pci_bus_id.endswith(":00.0")
    assert (p.gpu_instance, p.compute_instance) == (gi, ci)


def test_root_cause_of_xid_45() -> None:
    p = parse_line(
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=py, Ch 00000001 caused by previous Xid 149"
    )
    assert p is not None and p.root_cause_xid == 149
    assert p.message == "Ch 00000001 caused by previous Xid 149"
    q = parse_line("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=py, Ch 00000001")
    assert q is not None and q.root_cause_xid is None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:1b:00): banana",
        "NVRM: Xid (PCI:zzzz:1b:00): 79, x",
        "NVRM: Xid (PCI:0000:1b): 79, x",
        "NVRM: Xid (PCI:0000:1b:00 GPU-CI:01): 79, x",
        "NVRM: Xid (PCI:0000:1b:00 GPU-I:): 79, x",
        "NVRM: Xid (PCI:0000:1b:00 GPU-I:01 junk): 79, x",
        "NVRM: Xid",
        "usb 1-1: new high-speed USB device",
        "",
    ],
)
def test_parse_rejects(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("raw", "stripped"),
    [
        ("4,1234,5678901,-;NVRM: Xid (PCI:0000:1b:00): 79", "NVRM: Xid (PCI:0000:1b:00): 79"),
        ("6,1,2,c,more;hello", "hello"),
        ("[ 4909.922970] NVRM: Xid (0000:01:00): 13, x", "NVRM: Xid (0000:01:00): 13, x"),
        (
            "Nov 22 18:29:55 host kernel: [ 966.5] NVRM: Xid",
            "Nov 22 18:29:55 host kernel: [ 966.5] NVRM: Xid",
        ),
    ],
)
def test_strip_prefix(raw: str, stripped: str) -> None:
    assert strip_prefix(raw) == stripped


def test_syslog_line_with_prefixes_parses() -> None:
    line = "Nov 22 18:29:55 host kernel: [ 966.503025] NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=a, b"  # noqa: E501
    p = parse_line(strip_prefix(line))
    assert p is not None and p.xid == 79


_hex = "0123456789abcdef"


@settings(max_examples=300, deadline=None)
@given(
    dom=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    dev=st.integers(0, 0x1F),
    fn=st.one_of(st.none(), st.integers(0, 7)),
    xid=st.integers(1, 999),
    pid=st.one_of(st.none(), st.integers(0, 2**22), st.just("'<unknown>'")),
    name=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.<>-]{1,15}", fullmatch=True)),
    msg=st.from_regex(r"[A-Za-z0-9 .:()=x]{0,60}", fullmatch=True),
    prefix=st.sampled_from(
        [
            "",
            "[ 12.345678] ",
            "3,999,123456,-;",
            "4,17,99,-,caller=T123;",
            "[   12.3] [ T4711] ",
            "Nov 22 18:29:55 host kernel: [ 966.5] ",
        ]
    ),
    gi=st.one_of(st.none(), st.integers(0, 99)),
    ci=st.one_of(st.none(), st.integers(0, 99)),
)
def test_generated_lines_round_trip(
    dom: int,
    bus: int,
    dev: int,
    fn: int | None,
    xid: int,
    pid: object,
    name: str | None,
    msg: str,
    prefix: str,
    gi: int | None,
    ci: int | None,
) -> None:
    addr = f"{dom:04x}:{bus:02x}:{dev:02x}" + (f".{fn}" if fn is not None else "")
    if gi is not None:
        addr += f" GPU-I:{gi:02d}" + (f" GPU-CI:{ci:02d}" if ci is not None else "")
    else:
        ci = None
    parts = [str(xid)]
    if pid is not None:
        parts.append(f"pid={pid}")
        if name is not None:
            parts.append(f"name={name}")
    msg = msg.strip()
    if msg and not msg.startswith(("pid=", "name=")):
        parts.append(msg)
    else:
        msg = ""
    line = f"{prefix}NVRM: Xid (PCI:{addr}): " + ", ".join(parts)
    p = parse_line(strip_prefix(line))
    assert p is not None
    assert p.xid == xid
    assert p.pci_bus_id == f"{dom:08X}:{bus:02X}:{dev:02X}.{fn or 0}"
    assert p.pid == (pid if isinstance(pid, int) else None)
    assert p.process_name == (name if pid is not None else None)
    assert p.message == msg
    assert (p.gpu_instance, p.compute_instance) == (gi, ci)


NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "at"),
    [
        (  # rsyslog's RFC 3339 (Ubuntu 24.04 kern.log)
            "2026-11-22T09:59:00.123456+00:00 gpu-node kernel: NVRM: Xid (PCI:0000:1b:00): 79",
            datetime(2026, 11, 22, 9, 59, 0, 123456, tzinfo=UTC),
        ),
        (  # journalctl -o short-iso, another zone
            "2026-11-22T11:58:00+0200 gpu-node kernel: NVRM: Xid",
            datetime(2026, 11, 22, 9, 58, tzinfo=UTC),
        ),
        (  # RFC 3164, no year
            "Nov 22 09:58:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48",
            datetime(2026, 11, 22, 9, 58, 47, tzinfo=UTC),
        ),
        (  # New Year's Eve read on Jan 1st is last year's
            "Dec 31 23:59:59 h kernel: x",
            datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC),
        ),
        ("Nov  2 11:38:47 h kernel: x", datetime(2026, 11, 2, 11, 38, 47, tzinfo=UTC)),
        (  # journalctl -o short-precise
            "Jun 02 19:47:31.204518 gb200-node-7 kernel: NVRM: Xid",
            datetime(2026, 6, 2, 19, 47, 31, 204518, tzinfo=UTC),
        ),
        (  # dmesg -T
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13",
            datetime(2024, 8, 30, 11, 43, 9, tzinfo=UTC),
        ),
        (  # dmesg: seconds since boot (booted 1000 s ago)
            "[  966.503025] NVRM: Xid (PCI:0000:1b:00): 79",
            NOW - timedelta(seconds=1000 - 966.503025),
        ),
        (  # with a syslog priority
            "<3>[  966.503025] NVRM: Xid (PCI:0000:1b:00): 79",
            NOW - timedelta(seconds=1000 - 966.503025),
        ),
        ("Feb 29 10:00:00 h kernel: x", datetime(2024, 2, 29, 10, tzinfo=UTC)),  # leap year
        ("Feb 30 10:00:00 h kernel: x", None),
        ("NVRM: Xid (PCI:0000:1b:00): 79, no stamp", None),
        ("6,1,2,-;NVRM: Xid", None),
        ("", None),
    ],
)
def test_line_wall_time(line: str, at: datetime | None) -> None:
    now = NOW if not line.startswith("Dec") else datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    assert line_wall_time(line, now, 1000.0, UTC) == at


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1)))
def test_stamps_read_back_the_time_written(at: datetime) -> None:
    at = at.replace(tzinfo=UTC)
    iso = f"{at.isoformat(timespec='microseconds')} host kernel: NVRM: Xid"
    assert line_wall_time(iso, NOW, 1000.0, UTC) == at
    bsd = f"{at.strftime('%b')} {at.day:2d} {at.strftime('%H:%M:%S')} host kernel: x"
    read = line_wall_time(bsd, at + timedelta(hours=1), 1000.0, UTC)
    assert read == at.replace(microsecond=0)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=80))
def test_line_wall_time_never_raises(text: str) -> None:
    for candidate in (text, "2026-11-22T" + text, "Nov 22 " + text, "[" + text, "[ 1." + text):
        line_wall_time(candidate, NOW, 1000.0)
