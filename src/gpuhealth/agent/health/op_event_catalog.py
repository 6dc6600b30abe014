"""GPU Operational Events (the driver's structured records, R615+) as data, and the verdict for one.

The catalog lives in ``op_event_catalog.yaml`` beside this module (categories, severities,
scopes, the events NVIDIA published per driver release, each fact marked with how sure it is).
:func:`classify_event` answers what one event means for its GPU; pure and cached.

Rules (GOE is a preview; the legacy Xid is NVIDIA's stable contract):

* an event with a legacy Xid is judged by the XID catalog (the engine does that, once per
  occurrence); this module only adds the event's facts (scope, severity, attributes);
* an event without one is judged by its catalog row, else by its category and its own
  severity (``handled="category"``): never silently healthy for a RECOVERABLE / FATAL event,
  never worse than ``preview_cap`` (degraded): no hard taint on a preview field alone;
* group attributes: SIMULATED events are counted, never judged; RECOVERED and PREVERR (a
  previous error reported again) are counted and noted, and raise no verdict of their own;
* scope: the driver's own (no module widens it: an NVLink event the driver scopes to the
  device stays the GPU's; whether several trays' faults are the fabric's is the controller's
  domain judgement). The scope values are not published: a scope narrower than the GPU goes
  onto the condition only once its catalog row is ``published`` (:func:`condition_scope`),
  so an unconfirmed value never confines a RESET_GPU (or worse) to one MIG instance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

import yaml

from gpuhealth.agent.health.xid_catalog import CatalogError, Severity

Handled = Literal["code", "category"]

ATTRIBUTES: tuple[tuple[int, str], ...] = (
    (1 << 0, "uncontained"),
    (1 << 1, "latent"),
    (1 << 2, "propagated"),
    (1 << 3, "component-reset"),
    (1 << 4, "threshold-exceeded"),
    (1 << 5, "primary"),
    (1 << 6, "overflow"),
)
"""NVML_OPERATIONAL_EVENT_ATTR_* (bindings): bit -> name."""
ATTR_OVERFLOW = 1 << 6
GROUP_ATTRIBUTES: tuple[tuple[int, str], ...] = (
    (1 << 0, "recovered"),
    (1 << 1, "previous-error"),
    (1 << 2, "simulated"),
)
"""NVML_OPERATIONAL_EVENT_GROUP_ATTR_* (bindings; the same bits as UEFI CPER record flags)."""
GROUP_RECOVERED, GROUP_PREVERR, GROUP_SIMULATED = 1 << 0, 1 << 1, 1 << 2
_SEV_ORDER = {"healthy": 0, "degraded": 1, "unhealthy": 2}
_LABEL = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class OpEventRow:
    module: str
    code: int
    since: int
    name: str
    category: str
    xid: int | None
    severity: Severity | None
    action: str | None
    basis: str


@dataclass(frozen=True, slots=True)
class Category:
    value: int
    name: str
    indicates: str
    action: str
    basis: str


@dataclass(frozen=True, slots=True)
class ScopeRow:
    value: int
    name: str
    basis: str

    @property
    def confirmed(self) -> bool:
        """The value's meaning is published (not read off another enum's numbering)."""
        return self.basis == "published"


@dataclass(frozen=True, slots=True)
class OpCatalog:
    categories: Mapping[int, Category]
    by_name: Mapping[str, Category]
    severities: Mapping[int, tuple[str, Severity]]
    unknown_severity: Severity
    scopes: Mapping[int, ScopeRow]
    events: Mapping[tuple[str, int], OpEventRow]
    preview_cap: Severity
    releases: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpVerdict:
    """What one operational event means (before any legacy-Xid verdict)."""

    module: str
    code: int
    name: str
    """The catalog's event name, else ``<CATEGORY>_0x<code>``."""
    category: str
    handled: Handled
    severity: Severity
    action: str
    scope: str | None
    """The condition's scope (:func:`condition_scope`): ``gpu``, or a narrower scope whose
    value is published; None where the driver's value is unconfirmed and narrower than the GPU
    (the whole GPU: the MIG and remediation rules for a condition without a scope apply)."""
    scope_name: str
    """The driver's scope by the catalog's numbering (``gpu``, ``gpu-instance`` ...), for the
    message, confirmed or not."""
    event_severity: str
    """The driver's own severity name (``FATAL``, ``RECOVERABLE`` ...)."""
    legacy_xid: int | None
    attributes: tuple[str, ...]
    group: tuple[str, ...]
    """Group attributes: ``recovered``, ``previous-error``, ``simulated``."""
    condition_code: str
    """Label-value form of an event without a legacy Xid: ``goe-gpu-pshc-0x0003``."""
    message: str
    judged: bool
    """False: counted only (simulated, recovered, previous error)."""


def _severity(v: object, where: str) -> Severity:
    s = str(v)
    if s not in _SEV_ORDER:
        raise CatalogError(f"op_event_catalog.yaml {where}: severity {s!r}")
    return s  # type: ignore[return-value]


def parse_op_catalog(text: str) -> OpCatalog:
    """The catalog document, checked (a broken file is a packaging bug: CatalogError)."""
    doc: Any = yaml.safe_load(text)
    try:
        cats = {
            int(c["value"]): Category(
                int(c["value"]), str(c["name"]), str(c["indicates"]), str(c["action"]),
                str(c["basis"]),
            )
            for c in doc["categories"]
        }  # fmt: skip
        by_name = {c.name: c for c in cats.values()}
        sevs = {
            int(s["value"]): (str(s["name"]), _severity(s["health"], "severities"))
            for s in doc["severities"]
        }
        events: dict[tuple[str, int], OpEventRow] = {}
        for pos, e in enumerate(doc["events"]):
            row = OpEventRow(
                module=str(e["module"]),
                code=int(e["code"]),
                since=int(e["since"]),
                name=str(e["name"]),
                category=str(e["category"]),
                xid=None if e.get("xid") is None else int(e["xid"]),
                severity=None if e.get("severity") is None else _severity(e["severity"], "events"),
                action=None if e.get("action") is None else str(e["action"]),
                basis=str(e["basis"]),
            )
            if row.category not in by_name:
                raise CatalogError(f"events[{pos}]: unknown category {row.category!r}")
            if row.xid is None and row.severity is None:
                raise CatalogError(f"events[{pos}]: needs a legacy xid or a severity")
            if (row.module, row.code) in events:
                raise CatalogError(f"events[{pos}]: duplicate {row.module} 0x{row.code:04x}")
            events[(row.module, row.code)] = row
        cap = _severity(doc["preview_cap"], "preview_cap")
        for row in events.values():
            if row.severity is not None and _SEV_ORDER[row.severity] > _SEV_ORDER[cap]:
                raise CatalogError(f"{row.name}: severity above preview_cap")
        return OpCatalog(
            categories=cats,
            by_name=by_name,
            severities=sevs,
            unknown_severity=_severity(doc["unknown_severity"], "unknown_severity"),
            scopes={
                int(s["value"]): ScopeRow(int(s["value"]), str(s["name"]), str(s["basis"]))
                for s in doc["scopes"]
            },
            events=events,
            preview_cap=cap,
            releases=tuple(sorted(int(r) for r in doc["releases"])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CatalogError):
            raise
        raise CatalogError(f"op_event_catalog.yaml: {exc!r}") from exc


@cache
def op_catalog() -> OpCatalog:
    """Load (once) and check the catalog."""
    text = (
        resources.files(__package__ or "")
        .joinpath("op_event_catalog.yaml")
        .read_text(encoding="utf-8")
    )
    return parse_op_catalog(text)


def driver_release(version: str | None) -> int | None:
    """``620.12.03`` -> 620 (None when unknown)."""
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def names(mask: int, table: tuple[tuple[int, str], ...]) -> tuple[str, ...]:
    """Attribute bits -> names; bits the bindings do not name as ``bit<N>``."""
    out = [name for bit, name in table if mask & bit]
    known = 0
    for bit, _ in table:
        known |= bit
    out += [f"bit{i}" for i in range(32) if mask & ~known & (1 << i)]
    return tuple(out)


def _cap(sev: Severity, cap: Severity) -> Severity:
    return cap if _SEV_ORDER[sev] > _SEV_ORDER[cap] else sev


WHOLE_GPU = "gpu"


def condition_scope(raw: int) -> tuple[str | None, str, str]:
    """The driver's raw scope value -> (the condition's scope, the scope's name, a note for
    the message). A value the catalog does not list is the GPU's; a listed one narrower than
    the GPU counts only when published: the event's scope enum is not, and a guess must never
    confine a GPU-wide fault (a RESET_GPU destroys every MIG instance) to one instance."""
    row = op_catalog().scopes.get(raw)
    if row is None:
        return WHOLE_GPU, WHOLE_GPU, f" (raw {raw})"
    if row.name == WHOLE_GPU or row.confirmed:
        return row.name, row.name, ""
    return None, row.name, f" (raw {raw}, unconfirmed: not narrowed, the whole GPU)"


def condition_code(module: str, code: int) -> str:
    """``GPU-PSHC``, 3 -> ``goe-gpu-pshc-0x0003`` (a label value)."""
    mod = _LABEL.sub("-", module.lower()).strip("-") or "unknown"
    return f"goe-{mod}-0x{code & 0xFFFF:04x}"[:63]


@lru_cache(maxsize=4096)
def classify_event(
    module: str,
    code: int,
    category: int,
    severity: int,
    *,
    scope: int = 0,
    attributes: int = 0,
    group_attributes: int = 0,
    legacy_xid: int | None = None,
    driver: int | None = None,
) -> OpVerdict:
    """The verdict for one event; ``driver`` the driver release (620), None: the newest."""
    cat = op_catalog()
    row = cat.events.get((module, code))
    if row is not None and driver is not None and driver < row.since:
        row = None  # this driver release does not publish the code: judge by category
    category_row = cat.categories.get(category)
    if row is not None:
        category_row = cat.by_name.get(row.category, category_row)
    cat_name = category_row.name if category_row else f"CATEGORY_0x{category:04x}"
    sev_name, sev_health = cat.severities.get(
        severity, (f"SEVERITY_{severity}", cat.unknown_severity)
    )
    cond_scope, scope_name, scope_note = condition_scope(scope)
    group = names(group_attributes, GROUP_ATTRIBUTES)
    attrs = names(attributes, ATTRIBUTES)
    xid = legacy_xid if legacy_xid else (row.xid if row is not None else None)
    handled: Handled = "code" if row is not None else "category"
    if row is not None and row.severity is not None:
        health: Severity = row.severity
        action = row.action or "NONE"
    else:
        health = sev_health
        action = category_row.action if category_row else "CONTACT_SUPPORT"
    health = _cap(health, cat.preview_cap)
    judged = not group_attributes & (GROUP_SIMULATED | GROUP_RECOVERED | GROUP_PREVERR)
    if not judged:
        health = "healthy"
    if health == "healthy":
        action = "NONE"
    name = row.name if row is not None else f"{cat_name}_0x{code:04x}"
    facts = [f"{module} 0x{code:04x} {name}", f"category {cat_name}", f"severity {sev_name}"]
    facts.append(f"scope {scope_name}{scope_note}")
    if attrs:
        facts.append("attributes " + ",".join(attrs))
    if group:
        facts.append("group " + ",".join(group))
    if handled == "category":
        facts.append("unknown code: judged by category")
    return OpVerdict(
        module=module,
        code=code,
        name=name,
        category=cat_name,
        handled=handled,
        severity=health,
        action=action,
        scope=cond_scope,
        scope_name=scope_name,
        event_severity=sev_name,
        legacy_xid=xid,
        attributes=attrs,
        group=group,
        condition_code=condition_code(module, code),
        message="GPU operational event " + "; ".join(facts),
        judged=judged,
    )
