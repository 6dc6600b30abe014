"""The kernel's NVSwitch error line (``SXid``), parsed (pure).

HGX systems' NVSwitch driver logs each switch error as one headline and detail lines of
the same code:

- ``nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Non-fatal, Link 32 egress non-posted
  PRIV error (First)``
- ``nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up``
- ``nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED`` (no severity word)
- detail: ``…: 20034, Severity 1 Engine instance 60 Sub-engine instance 00`` and
  ``…: 20034, Data {0x10000000, …}``

A headline says ``Fatal`` or ``Non-fatal``; one without either (SOE errors) is taken as fatal
when its code is in :data:`FATAL_WITHOUT_WORD` and as non-fatal otherwise. Detail lines are
recognised and return a :class:`ParsedSxid` with ``detail=True`` (nothing to report). Like the
XID parser it accepts /dev/kmsg records, dmesg and syslog lines (the caller strips record
headers), never raises on garbage, and answers ``None`` for a line that is not an SXid line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhealth.agent.sources.kmsg.parser import kernel_pci_to_nvml

_SXID = re.compile(
    r"nvidia-nvswitch(?P<sw>\d{1,4}): SXid \((?:PCI:)?(?P<dom>[0-9a-fA-F]{4,8}):"
    r"(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?\):\s*"
    r"(?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?$"
)
_SEVERITY = re.compile(r"(?P<word>Non-fatal|Fatal)\s*(?:,\s*|$)", re.IGNORECASE)
_LINK = re.compile(r"Link\s+(?P<link>\d{1,3})\b\s*")
_DETAIL = re.compile(r"(?:Severity \d+ Engine instance|Data \{)")

FATAL_WITHOUT_WORD = frozenset({26006, 26007, 26008})
"""SOE (the switch's security engine) halted, external error, watchdog: logged without a
severity word and fatal to the switch (NVIDIA Fabric Manager user guide)."""


@dataclass(frozen=True, slots=True)
class ParsedSxid:
    sxid: int
    switch: int
    pci_bus_id: str
    """NVML form: ``00000000:C6:00.0``."""
    fatal: bool
    link: int | None = None
    message: str = ""
    detail: bool = False
    """A detail line (``Severity …`` / ``Data {…}``) following a headline of the same code."""


def parse_sxid(line: str) -> ParsedSxid | None:
    """Parse one kernel-log line (record header already stripped); ``None`` when it is not a
    well-formed ``SXid`` line."""
    idx = line.find("nvidia-nvswitch")
    if idx < 0 or "SXid" not in line:
        return None
    m = _SXID.match(line.rstrip("\r\n"), idx)
    if m is None:
        return None
    try:
        code = int(m.group("code"))
        switch = int(m.group("sw"))
        pci = kernel_pci_to_nvml(m.group("dom"), m.group("bus"), m.group("dev"), m.group("fn"))
    except ValueError:
        return None
    rest = (m.group("rest") or "").strip()
    if _DETAIL.match(rest):
        return ParsedSxid(code, switch, pci, fatal=False, message=rest, detail=True)
    sev = _SEVERITY.match(rest)
    if sev is not None:
        fatal = sev.group("word").lower() == "fatal"
        rest = rest[sev.end() :]
    else:
        fatal = code in FATAL_WITHOUT_WORD
    link: int | None = None
    lm = _LINK.match(rest)
    if lm is not None:
        link = int(lm.group("link"))
        rest = rest[lm.end() :]
    return ParsedSxid(code, switch, pci, fatal=fatal, link=link, message=rest.strip())
