"""The kernel's ``NVRM: Xid`` line, parsed (pure).

Accepts /dev/kmsg records (``prio,seq,ts_us,flags;message``), dmesg lines with a ``[time]``
prefix, and syslog lines. The XID line is
``NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``;
older drivers omit ``name=``, the pid may be ``'<unknown>'``, and the PCI address contains
digits, so the code is anchored after the ``)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<dom>[0-9a-fA-F]{4,8}):"
    r"(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.(?P<fn>[0-7]))?\):\s*(?P<xid>\d{1,6})(?:,\s*(?P<rest>.*))?$"
)
_PID = re.compile(r"pid=(?P<pid>\d+|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*?)\s*(?:,\s*|$)")


@dataclass(frozen=True, slots=True)
class ParsedXid:
    xid: int
    pci_bus_id: str
    """NVML form: ``00000000:1B:00.0``."""
    pid: int | None
    process_name: str | None
    message: str


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
    return ParsedXid(xid=xid, pci_bus_id=pci, pid=pid, process_name=name, message=rest.strip())
