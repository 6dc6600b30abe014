"""GPU Operational Events in simulator scenarios: ``operational_event: "<MODULE> <code> ..."``.

```yaml
faults:
  - {at: 5, gpu: 2, operational_event: "GPU-PSHC 0x0003"}            # by the catalog row
  - {at: 6, gpu: 3, operational_event: "GPU-RAS 0x0030 category=2 severity=FATAL"}
  - {at: 7, gpu: 1, operational_event: "GPU-BUS 0x0003 xid=79"}      # with its legacy Xid
  - {at: 8, gpu: 1, operational_event: "GPU-RAS 0x0031 category=2 group=simulated"}
```

Keys: ``category`` (a name of the event catalog or a number), ``severity`` (``INFORMATIONAL``,
``CORRECTED``, ``RECOVERABLE``, ``FATAL`` or a number), ``xid`` (the legacy Xid), ``scope``
(a number), ``attrs`` and ``group`` (comma-separated attribute names, as the catalog names them:
``primary``, ``uncontained`` ..., ``recovered``, ``previous-error``, ``simulated``). A known
event's category and legacy Xid come from its catalog row unless given. The simulator reports
the event as NVML's event set would (``source: sim``): with the kernel-log line of its legacy
Xid, written by the test or demo, it is one occurrence.
"""

from __future__ import annotations

import itertools
from datetime import datetime

from gpuhealth.agent.health.op_event_catalog import ATTRIBUTES, GROUP_ATTRIBUTES, op_catalog
from gpuhealth.agent.observations import OperationalEventObservation

_KEYS = frozenset({"category", "severity", "xid", "scope", "attrs", "group"})
_CURSOR = itertools.count(0x5100_0000)
_PRIMARY = 1 << 5


class SpecError(ValueError):
    """A scenario's operational_event text that does not parse (the message says why)."""


def _int(v: str, what: str) -> int:
    try:
        n = int(v, 0)
    except ValueError:
        raise SpecError(f"{what} {v!r} is not a number") from None
    if not 0 <= n <= 0xFFFF_FFFF:
        raise SpecError(f"{what} {v!r} is out of range")
    return n


def _bits(v: str, table: tuple[tuple[int, str], ...], what: str) -> int:
    by_name = {name: bit for bit, name in table}
    out = 0
    for name in (x for x in v.split(",") if x):
        if name not in by_name:
            raise SpecError(f"{what} {name!r} is not one of {sorted(by_name)}")
        out |= by_name[name]
    return out


def parse_spec(text: str) -> tuple[str, ...]:
    """Check ``text`` and return its tokens (the scenario keeps them as the fault's value)."""
    tokens = tuple(text.split())
    if len(tokens) < 2:
        raise SpecError('expected "<MODULE> <code> [key=value ...]"')
    if not 1 <= len(tokens[0]) <= 16:
        raise SpecError(f"module {tokens[0]!r}: 1 to 16 characters")
    _int(tokens[1], "code")
    for tok in tokens[2:]:
        key, eq, _ = tok.partition("=")
        if not eq or key not in _KEYS:
            raise SpecError(f"{tok!r}: expected one of {sorted(_KEYS)} as key=value")
    observation(tokens, "GPU-check", datetime(2026, 1, 1))  # every value checked
    return tokens


def observation(tokens: tuple[str, ...], uuid: str, at: datetime) -> OperationalEventObservation:
    """The event a parsed spec stands for, on GPU ``uuid``."""
    cat = op_catalog()
    module, code = tokens[0], _int(tokens[1], "code")
    row = cat.events.get((module, code))
    category = cat.by_name[row.category].value if row is not None else 0
    xid = row.xid if row is not None else None
    severity, scope, attrs, group = 30, 0, _PRIMARY, 0
    sev_by_name = {name: value for value, (name, _) in cat.severities.items()}
    for tok in tokens[2:]:
        key, _, value = tok.partition("=")
        if key == "category":
            named = cat.by_name.get(value)
            category = named.value if named is not None else _int(value, "category")
        elif key == "severity":
            severity = sev_by_name.get(value.upper()) or _int(value, "severity")
        elif key == "xid":
            xid = _int(value, "xid") or None
        elif key == "scope":
            scope = _int(value, "scope")
        elif key == "attrs":
            attrs = _bits(value, ATTRIBUTES, "attribute")
        else:
            group = _bits(value, GROUP_ATTRIBUTES, "group attribute")
    return OperationalEventObservation(
        source="sim",
        at=at,
        uuid=uuid,
        module=module,
        code=code,
        category=category,
        severity=severity,
        scope=scope,
        attributes=attrs,
        group_attributes=group,
        legacy_xid=xid,
        group_cursor=next(_CURSOR),
    )
