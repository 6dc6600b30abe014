"""NVIDIA's XID catalog (Ampere and newer) as data, and the verdict for one XID.

The catalog lives in ``xid_catalog.yaml`` beside this module (one row per code, with the
published immediate action and gpuhealth's effective action and severity). This module
loads it once and answers :func:`classify`: what one XID means for its GPU.

Severity rules (docs/architecture.md "Agent"): IGNORE / RESTART_APP are counted and reported
but leave the GPU healthy (13, 31, 43, and 45 alone are application faults); RESET_GPU,
RESTART_BM, RESTART_VM, CONTACT_SUPPORT and the ECC / NVLink workflows make it unhealthy;
anything else, and any code missing from the catalog, makes it degraded: never silently
healthy, never a fleet-wide outage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Literal

import yaml

Severity = Literal["healthy", "degraded", "unhealthy"]
_SEVERITIES: frozenset[str] = frozenset({"healthy", "degraded", "unhealthy"})

XID_154 = 154
"""GPU_RECOVERY_ACTION_CHANGED: summarises another XID; its message names the new action."""

_RECOVERY_ACTIONS: tuple[tuple[str, str, Severity], ...] = (
    ("node reboot required", "RESTART_BM", "unhealthy"),
    ("gpu reset required", "RESET_GPU", "unhealthy"),
    ("drain and reset", "RESET_GPU", "unhealthy"),
    ("drain p2p", "DRAIN_P2P", "degraded"),
)
_RECOVERY_TO = re.compile(r"\bto\s+0x[0-9a-f]+\s*\(([^)]*)\)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalog row."""

    xid: int
    name: str
    description: str
    category: str
    catalog_action: str | None
    """NVIDIA's published immediate action (``None`` where none is published)."""
    action: str
    """The action gpuhealth reports (a concrete action where the catalog names a workflow)."""
    severity: Severity
    investigate: str | None
    applies: tuple[str, ...]
    note: str | None = None


@dataclass(frozen=True, slots=True)
class XidVerdict:
    """What one XID means for its GPU."""

    xid: int
    severity: Severity
    action: str
    reason: str
    """``XidError`` for catalogued codes, ``UnknownXid`` otherwise."""
    code: str
    """Label-value form, ``xid-79``."""
    message: str
    known: bool
    application: bool
    """An application fault (counted; repeated ones may escalate)."""


class CatalogError(ValueError):
    """The shipped catalog file is broken (a packaging bug, caught by the unit tests)."""


def _opt(v: object) -> str | None:
    return None if v is None else str(v)


def _row(raw: object, pos: int) -> XidInfo:
    if not isinstance(raw, dict):
        raise CatalogError(f"xids[{pos}] is not a mapping")
    try:
        sev = str(raw["severity"])
        if sev not in _SEVERITIES:
            raise CatalogError(f"xids[{pos}].severity {sev!r} is not one of {sorted(_SEVERITIES)}")
        applies = str(raw.get("applies") or "")
        return XidInfo(
            xid=int(raw["xid"]),
            name=str(raw["name"]),
            description=str(raw["description"]),
            category=str(raw["category"]),
            catalog_action=None
            if raw.get("catalog_action") is None
            else str(raw["catalog_action"]),
            action=str(raw["action"]),
            severity=sev,  # type: ignore[arg-type]
            investigate=_opt(raw.get("investigate")),
            applies=tuple(a for a in applies.split(",") if a),
            note=_opt(raw.get("note")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CatalogError):
            raise
        raise CatalogError(f"xids[{pos}]: {exc}") from exc


@cache
def catalog() -> dict[int, XidInfo]:
    """The catalog, keyed by XID code (loaded once)."""
    text = (
        resources.files(__package__ or "").joinpath("xid_catalog.yaml").read_text(encoding="utf-8")
    )
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("xids"), list):
        raise CatalogError("xid_catalog.yaml: top level must be a mapping with a list 'xids'")
    out: dict[int, XidInfo] = {}
    for pos, raw in enumerate(doc["xids"]):
        info = _row(raw, pos)
        if info.xid in out:
            raise CatalogError(f"xids[{pos}]: duplicate xid {info.xid}")
        out[info.xid] = info
    return out


def lookup(xid: int) -> XidInfo | None:
    return catalog().get(xid)


def _recovery_action(message: str) -> tuple[str, Severity] | None:
    """XID 154: ``... recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)``."""
    m = _RECOVERY_TO.search(message)
    target = (m.group(1) if m else message).strip().lower()
    if target == "none":
        return ("IGNORE", "healthy")
    for needle, action, sev in _RECOVERY_ACTIONS:
        if needle in target:
            return (action, sev)
    return None


@lru_cache(maxsize=1024)
def _static_verdict(xid: int) -> XidVerdict:
    info = catalog().get(xid)
    if info is None:
        return XidVerdict(
            xid=xid,
            severity="degraded",
            action="CONTACT_SUPPORT",
            reason="UnknownXid",
            code=f"xid-{xid}",
            message=f"XID {xid} is not in the catalog",
            known=False,
            application=False,
        )
    return XidVerdict(
        xid=xid,
        severity=info.severity,
        action=info.action,
        reason="XidError",
        code=f"xid-{xid}",
        message=info.description,
        known=True,
        application=info.category == "application",
    )


def classify(xid: int, message: str = "") -> XidVerdict:
    """The verdict for one XID; ``message`` matters only for XID 154."""
    verdict = _static_verdict(xid)
    if xid == XID_154 and message:
        found = _recovery_action(message)
        if found is not None:
            action, sev = found
            return XidVerdict(
                xid=xid,
                severity=sev,
                action=action,
                reason=verdict.reason,
                code=verdict.code,
                message=f"{verdict.message}: {action}",
                known=True,
                application=False,
            )
    return verdict
