"""NVIDIA's XID catalog (Ampere and newer) as data, and the verdict for one XID.

The catalog lives in ``xid_catalog.yaml`` beside this module (one row per code, with the
published immediate action and gpuhealth's effective action and severity). This module
loads it once (:func:`load`, at the agent's start, with libyaml where PyYAML has it) and
answers :func:`classify`: what one XID means for its GPU. Where a row names a ``decode`` table,
the driver's message refines the verdict (:mod:`gpuhealth.agent.health.xid_decode`: XID 154's
recovery action, the NVLink5 XIDs 144-150).

Severity rules (docs/architecture.md "Agent"): IGNORE / RESTART_APP are counted and reported
but leave the GPU healthy (13, 31, 43, and 45 alone are application faults); RESET_GPU,
RESTART_BM, RESTART_VM, CONTACT_SUPPORT and the ECC / NVLink workflows make it unhealthy;
anything else, and any code missing from the catalog, makes it degraded: never silently
healthy, never a fleet-wide outage.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

import yaml

from gpuhealth.agent.health import xid_decode
from gpuhealth.agent.health.xid_decode import Decoded, DecodeTables, Nvlink5Rule
from gpuhealth.common.logging import get_logger

log = get_logger("xid_catalog")

Severity = Literal["healthy", "degraded", "unhealthy"]
_SEVERITIES: frozenset[str] = frozenset({"healthy", "degraded", "unhealthy"})
_DECODERS: frozenset[str] = frozenset({"recovery_action", "nvlink5"})

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader when PyYAML was built with it (~10x faster), else the pure-Python one."""


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
    decode: str | None = None
    """The table (``recovery_action``, ``nvlink5``) that reads the verdict from the message."""


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
    decoded: bool = False
    """The message (or NVML's recovery action) decided this verdict, where the catalog says it
    should: more specific than an observation of the same XID without one."""


@dataclass(frozen=True, slots=True)
class Catalog:
    xids: Mapping[int, XidInfo]
    tables: DecodeTables
    nvml_unreported: tuple[int, ...]
    """XIDs NVML's event set never delivers: only the kernel log sees them."""


class CatalogError(ValueError):
    """The shipped catalog file is broken (a packaging bug, caught by the unit tests)."""


def _opt(v: object) -> str | None:
    return None if v is None else str(v)


def _severity(v: object, where: str) -> Severity:
    sev = str(v)
    if sev not in _SEVERITIES:
        raise CatalogError(f"{where}: severity {sev!r} is not one of {sorted(_SEVERITIES)}")
    return sev  # type: ignore[return-value]


def _row(raw: object, pos: int) -> XidInfo:
    if not isinstance(raw, dict):
        raise CatalogError(f"xids[{pos}] is not a mapping")
    try:
        sev = _severity(raw["severity"], f"xids[{pos}]")
        applies = str(raw.get("applies") or "")
        decode = _opt(raw.get("decode"))
        if decode is not None and decode not in _DECODERS:
            raise CatalogError(f"xids[{pos}]: decode {decode!r} is not one of {sorted(_DECODERS)}")
        return XidInfo(
            xid=int(raw["xid"]),
            name=str(raw["name"]),
            description=str(raw["description"]),
            category=str(raw["category"]),
            catalog_action=None
            if raw.get("catalog_action") is None
            else str(raw["catalog_action"]),
            action=str(raw["action"]),
            severity=sev,
            investigate=_opt(raw.get("investigate")),
            applies=tuple(a for a in applies.split(",") if a),
            note=_opt(raw.get("note")),
            decode=decode,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CatalogError):
            raise
        raise CatalogError(f"xids[{pos}]: {exc}") from exc


def _list(doc: Mapping[str, Any], key: str) -> Sequence[Any]:
    v = doc.get(key)
    if not isinstance(v, list):
        raise CatalogError(f"xid_catalog.yaml: {key!r} must be a list")
    return v


def _tables(doc: Mapping[str, Any]) -> DecodeTables:
    try:
        sev = {str(k): _severity(v, "decode_actions") for k, v in doc["decode_actions"].items()}
        nvlink5: dict[tuple[int, str], list[Nvlink5Rule]] = {}
        for pos, r in enumerate(_list(doc, "nvlink5")):
            rule = Nvlink5Rule(
                xid=int(r["xid"]),
                units=frozenset(str(r["unit"]).split("/")),
                status=int(r["status"]),
                subcode=None if r.get("subcode") is None else int(r["subcode"]),
                action=str(r["action"]),
                fatal=bool(r["fatal"]),
            )
            if rule.action not in sev:
                raise CatalogError(f"nvlink5[{pos}]: action {rule.action!r} not in decode_actions")
            for unit in rule.units:
                nvlink5.setdefault((rule.xid, unit), []).append(rule)
        unlisted = {str(k): str(v) for k, v in doc["nvlink5_unlisted"].items()}
        if not set(unlisted.values()) <= set(sev):
            raise CatalogError("nvlink5_unlisted: every action must be in decode_actions")
        capped = str(doc["nvlink5_driver_nonfatal"])
        if sev.get(capped) not in ("healthy", "degraded"):
            raise CatalogError("nvlink5_driver_nonfatal: a decode action that is not unhealthy")
        ranks = {str(a): i for i, a in enumerate(_list(doc, "action_rank"))}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, CatalogError):
            raise
        raise CatalogError(f"xid_catalog.yaml: {exc!r}") from exc
    return DecodeTables(
        nvlink5={k: tuple(v) for k, v in nvlink5.items()},
        decode_severity=sev,
        nvlink5_unlisted=unlisted,
        nvlink5_driver_nonfatal=capped,
        action_rank=ranks,
    )


def parse_catalog(text: str) -> Catalog:
    """The catalog document (``xid_catalog.yaml``'s text), checked."""
    doc = yaml.load(text, Loader=_Loader)
    if not isinstance(doc, dict) or not isinstance(doc.get("xids"), list):
        raise CatalogError("xid_catalog.yaml: top level must be a mapping with a list 'xids'")
    out: dict[int, XidInfo] = {}
    for pos, raw in enumerate(doc["xids"]):
        info = _row(raw, pos)
        if info.xid in out:
            raise CatalogError(f"xids[{pos}]: duplicate xid {info.xid}")
        out[info.xid] = info
    unreported = tuple(sorted(int(x) for x in _list(doc, "nvml_unreported")))
    return Catalog(xids=out, tables=_tables(doc), nvml_unreported=unreported)


@cache
def _loaded() -> Catalog:
    start = time.perf_counter()
    text = (
        resources.files(__package__ or "").joinpath("xid_catalog.yaml").read_text(encoding="utf-8")
    )
    cat = parse_catalog(text)
    log.info(
        "xid_catalog_loaded",
        xids=len(cat.xids),
        libyaml=_Loader is not yaml.SafeLoader,
        seconds=round(time.perf_counter() - start, 4),
    )
    return cat


def load() -> Catalog:
    """Load (once) and check the catalog: the agent calls this at start, so the first XID
    never pays for it and a broken catalog stops the agent before it reports anything."""
    return _loaded()


def catalog() -> Mapping[int, XidInfo]:
    """The catalog, keyed by XID code (loaded once)."""
    return _loaded().xids


def lookup(xid: int) -> XidInfo | None:
    return catalog().get(xid)


def outranks(new: XidVerdict, severity: str, action: str) -> bool:
    """``new`` is worse than a condition of ``severity`` / ``action``."""
    tables = _loaded().tables
    return xid_decode.rank(tables, new.severity, new.action) > xid_decode.rank(
        tables,
        severity,  # type: ignore[arg-type]
        action,
    )


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


def _decode(info: XidInfo, message: str) -> Decoded | None:
    if not message:
        return None
    if info.decode == "recovery_action":
        return xid_decode.recovery_action(message)
    if info.decode == "nvlink5":
        tables = _loaded().tables
        return xid_decode.nvlink5(tables, info.xid, message)
    return None


def classify(xid: int, message: str = "") -> XidVerdict:
    """The verdict for one XID. ``message`` (the driver's text) matters only where the
    catalog row names a decoder (XID 154, the NVLink5 XIDs)."""
    verdict = _static_verdict(xid)
    info = catalog().get(xid)
    if info is None or info.decode is None:
        return verdict
    found = _decode(info, message)
    if found is None:
        return verdict
    action, sev, detail = found
    return XidVerdict(
        xid=xid,
        severity=sev,
        action=action,
        reason=verdict.reason,
        code=verdict.code,
        message=f"{verdict.message} ({detail}): {action}",
        known=True,
        application=False,
        decoded=True,
    )
