"""The kernel's ``NVRM: Xid`` line, parsed (pure).

Accepts /dev/kmsg records (``prio,seq,ts_us,flags[,caller=T1];message``), dmesg lines with a
``[time]`` prefix, and syslog/journald lines: the parser looks for ``NVRM: Xid`` anywhere in the
line. The driver (open-gpu-kernel-modules, ``kernel_rc.c``) prints

- ``NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``
- on a MIG GPU, attributed to a GPU instance: ``NVRM: Xid (PCI:0000:1b:00 GPU-I:05): 94, …``
- and to a compute instance too: ``NVRM: Xid (PCI:0000:1b:00 GPU-I:05 GPU-CI:01): 43, …``
- XID 45 after another XID: ``…, Ch 00000001 caused by previous Xid 149``

Older drivers omit ``PCI:`` and ``name=``, the pid may be ``'<unknown>'``, and the PCI address
contains digits, so the code is anchored after the ``)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<dom>[0-9a-fA-F]{4,8}):"
    r"(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?"
    r"(?:\s+GPU-I:\s*(?P<gi>\d{1,5})(?:\s+GPU-CI:\s*(?P<ci>\d{1,5}))?)?"
    r"\):\s*(?P<xid>\d{1,6})(?:,\s*(?P<rest>.*))?$"
)
_PID = re.compile(r"pid=(?P<pid>\d+|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*?)\s*(?:,\s*|$)")
_ROOT_CAUSE = re.compile(r"\s*\bcaused by previous Xid (?P<xid>\d{1,6})\s*$")


@dataclass(frozen=True, slots=True)
class ParsedXid:
    xid: int
    pci_bus_id: str
    """NVML form: ``00000000:1B:00.0``."""
    pid: int | None
    process_name: str | None
    message: str
    gpu_instance: int | None = None
    """MIG GPU instance id (``GPU-I:``) the driver attributed the XID to."""
    compute_instance: int | None = None
    """MIG compute instance id (``GPU-CI:``) within that GPU instance."""
    root_cause_xid: int | None = None
    """XID 45's ``caused by previous Xid N``: the XID this one follows from."""


def kernel_pci_to_nvml(domain: str, bus: str, device: str, function: str | None = None) -> str:
    """``0000``, ``1b``, ``00`` -> ``00000000:1B:00.0`` (NVML's bus id form)."""
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function or '0'}"


def strip_prefix(line: str) -> str:
    """Drop a /dev/kmsg record header (``6,123,456,-;``) or a dmesg ``[  12.3]`` prefix."""
    semi = line.find(";")
    if 0 < semi < 64 and line[0].isdigit():
        head = line[:semi].split(",")
        if len(head) >= 3 and head[0].isdigit() and head[1].isdigit():
            return line[semi + 1 :]
    if line.startswith("["):
        close = line.find("]")
        if 0 < close < 32:
            return line[close + 1 :].lstrip()
    return line


def _record_header(line: str) -> list[str] | None:
    """The fields of a /dev/kmsg record header (``prio,seq,usec,flags[,…]``), or None."""
    semi = line.find(";")
    if not 0 < semi < 64 or not line[0].isdigit():
        return None
    head = line[:semi].split(",")
    if len(head) < 4 or not head[0].isdigit() or not head[1].isdigit():
        return None
    return head


def record_seq(line: str) -> int | None:
    """The sequence number of a /dev/kmsg record (``prio,SEQ,usec,flags[,…];msg``); None for a
    line without that header."""
    head = _record_header(line)
    return None if head is None else int(head[1])


def record_time_us(line: str) -> int | None:
    """The timestamp of a /dev/kmsg record (``prio,seq,USEC,flags[,…];msg``): microseconds of
    the kernel's monotonic clock since boot; None for a line without that header."""
    head = _record_header(line)
    if head is None or not head[2].isdigit():
        return None
    return int(head[2])


def record_wall_time(time_us: int, now: datetime, monotonic_s: float) -> datetime:
    """When a record stamped ``time_us`` was logged, on the wall clock: ``now`` less the time
    since, both read now (``monotonic_s``: CLOCK_MONOTONIC, the clock of the record's stamp).

    Boot time as ``now - monotonic`` rather than ``/proc/stat`` ``btime``: btime has whole
    seconds and counts time suspended (CLOCK_BOOTTIME), which the kernel's log stamps do not,
    and it is the same clock pair read at the same instant. Like ``dmesg -T`` the result is off
    by however far the kernel's log clock (``local_clock``, not slewed by NTP) has drifted from
    CLOCK_MONOTONIC since boot. Never later than ``now``.
    """
    age_s = monotonic_s - time_us / 1_000_000
    return now - timedelta(seconds=age_s) if age_s > 0 else now


_ISO = re.compile(
    r"(?P<d>\d{4}-\d{2}-\d{2})[T ](?P<t>\d{2}:\d{2}:\d{2})(?P<f>\.\d{1,9})?"
    r"(?P<z>Z|[+-]\d{2}:?\d{2})?\s"
)
_BSD = re.compile(
    r"(?P<m>[A-Z][a-z]{2}) {1,2}(?P<d>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2})(?P<f>\.\d{1,9})?\s"
)
_CTIME = re.compile(r"\[(?P<c>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]")
_PRIORITY = re.compile(r"<\d{1,3}>")
_UPTIME = re.compile(r"\[\s*(?P<s>\d{1,10})\.(?P<us>\d{1,9})\]")


def line_wall_time(
    line: str, now: datetime, monotonic_s: float, tz: tzinfo | None = None
) -> datetime | None:
    """When a kernel-log line of a followed file was logged, from its own stamp: RFC 3339
    (rsyslog's high-precision format, ``journalctl -o short-iso``), RFC 3164 (``Nov 22
    18:29:55 host kernel: …``, with ``journalctl -o short-precise``'s fraction; no year: the
    latest that is not more than a day ahead of ``now``), ``dmesg -T``'s ``[Fri Aug 30
    11:43:09 2024]``, or ``dmesg``'s seconds since boot ``[  966.503025]`` (through
    :func:`record_wall_time`). A stamp without a zone is in ``tz`` (None: the agent's local
    zone, which must be the host's). A leading syslog priority (``<3>``) is skipped. None:
    no stamp."""
    if (pri := _PRIORITY.match(line)) is not None:
        line = line[pri.end() :]
    try:
        if (m := _ISO.match(line)) is not None:
            zone = (m.group("z") or "").replace("Z", "+00:00")
            at = datetime.fromisoformat(f"{m.group('d')}T{m.group('t')}{zone}")
            return _aware(at.replace(microsecond=_micro(m.group("f"))), tz)
        if (m := _BSD.match(line)) is not None:
            text = f"{m.group('m')} {int(m.group('d')):02d} {m.group('t')}"
            return _latest_year(text, _micro(m.group("f")), now, tz)
        if (m := _CTIME.match(line)) is not None:
            return _aware(datetime.strptime(m.group("c"), "%a %b %d %H:%M:%S %Y"), tz)
        if (m := _UPTIME.match(line)) is not None:
            time_us = int(m.group("s")) * 1_000_000 + int(m.group("us").ljust(6, "0")[:6])
            return record_wall_time(time_us, now, monotonic_s)
    except ValueError:  # a date that does not exist (Feb 30), out of range
        return None
    return None


def _micro(fraction: str | None) -> int:
    """``.204518`` (any number of digits) -> microseconds."""
    return int(fraction[1:7].ljust(6, "0")) if fraction else 0


def _latest_year(text: str, micro: int, now: datetime, tz: tzinfo | None) -> datetime | None:
    for year in range(now.year + 1, now.year - 5, -1):  # Feb 29: back to a leap year
        try:
            naive = datetime.strptime(f"{year} {text}", "%Y %b %d %H:%M:%S")
        except ValueError:
            continue
        at = _aware(naive.replace(microsecond=micro), tz)
        if at <= now + timedelta(days=1):
            return at
    return None


def _aware(at: datetime, tz: tzinfo | None) -> datetime:
    if at.tzinfo is None:
        at = at.replace(tzinfo=tz) if tz is not None else at.astimezone()
    return at.astimezone(UTC)


def _opt_int(raw: str | None) -> int | None:
    return None if raw is None else int(raw)


def parse_line(line: str) -> ParsedXid | None:
    """Parse one kernel-log line; ``None`` when it is not a well-formed NVRM Xid line."""
    idx = line.find("NVRM: Xid")
    if idx < 0:
        return None
    m = _XID.match(line.rstrip("\r\n"), idx)
    if m is None:
        return None
    try:
        xid = int(m.group("xid"))
        pci = kernel_pci_to_nvml(m.group("dom"), m.group("bus"), m.group("dev"), m.group("fn"))
    except ValueError:
        return None
    rest = m.group("rest") or ""
    pid: int | None = None
    name: str | None = None
    pm = _PID.match(rest)
    if pm is not None:
        raw = pm.group("pid")
        pid = int(raw) if raw.isdigit() else None
        rest = rest[pm.end() :]
        nm = _NAME.match(rest)
        if nm is not None:
            name = nm.group("name") or None
            rest = rest[nm.end() :]
    root: int | None = None
    rc = _ROOT_CAUSE.search(rest)
    if rc is not None:
        root = int(rc.group("xid"))
    return ParsedXid(
        xid=xid,
        pci_bus_id=pci,
        pid=pid,
        process_name=name,
        message=rest.strip(),
        gpu_instance=_opt_int(m.group("gi")),
        compute_instance=_opt_int(m.group("ci")),
        root_cause_xid=root,
    )
