"""Episodes for people: the ``remediation`` section of ``/api/v1/fleet`` and of the status
page's overview (the pipeline: episodes per phase, and the episodes, compact), and the table
``gpuhealth-controller status`` prints from it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from gpuhealth.controller.remediation.model import TERMINAL_PHASES, Episode, Phase

COLUMNS = ("NODE", "PHASE", "ACTION", "REASON", "IN PHASE", "AGE", "EVICTED", "EPISODE")
MAX_SHOWN = 200
"""Episodes listed in the JSON (in progress first, then escalated/failed, then returned);
the pipeline counts them all."""


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _since(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else round(max(0.0, (now - since).total_seconds()), 1)


def _rank(ep: Episode) -> int:
    """In progress, then waiting for a person (escalated, failed), then returned."""
    if ep.phase not in TERMINAL_PHASES:
        return 0
    return 2 if ep.phase is Phase.RETURNED else 1


def _ordered(episodes: Iterable[Episode]) -> list[Episode]:
    """By :func:`_rank`, then the most recent first."""
    return sorted(episodes, key=lambda e: (_rank(e), -e.spec.fault.detected_at.timestamp(), e.name))


def episode_json(ep: Episode, now: datetime) -> dict[str, Any]:
    """One episode, compact: what the status CLI's table and the status page show."""
    since = getattr(ep.status.times, ep.phase.value.lower(), None)
    detected = ep.status.times.detected or ep.spec.fault.detected_at
    return {
        "name": ep.name,
        "node": ep.node,
        "phase": ep.phase.value,
        "action": ep.spec.action,
        "reason": ep.status.reason,
        "message": ep.status.message,
        "detected_at": detected.isoformat(),
        "phase_since": since.isoformat() if since is not None else None,
        "in_phase_s": _since(since, now),
        "age_s": _since(detected, now),
        "evicted": ep.status.evicted_count,
        "waiting": ep.status.waiting_count,
    }


def remediation_json(
    episodes: Iterable[Episode], now: datetime, limit: int = MAX_SHOWN
) -> dict[str, Any]:
    """``remediation`` of ``/api/v1/fleet`` and of the status page's overview."""
    ordered = _ordered(episodes)
    return {
        "pipeline": pipeline(ordered),
        "total": len(ordered),
        "episodes": [episode_json(ep, now) for ep in ordered[:limit]],
    }


def row(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """A table row from :func:`episode_json` (as read back from JSON)."""
    return (
        str(doc.get("node", "?")),
        str(doc.get("phase", "?")),
        str(doc.get("action", "?")),
        str(doc.get("reason") or "-"),
        _duration(doc.get("in_phase_s")),
        _duration(doc.get("age_s")),
        str(doc.get("evicted", 0)),
        str(doc.get("name", "?")),
    )


def rows(episodes: Iterable[Episode], now: datetime) -> list[tuple[str, ...]]:
    return [row(episode_json(ep, now)) for ep in _ordered(episodes)]


def table(docs: Iterable[Mapping[str, Any]]) -> str:
    lines: list[tuple[str, ...]] = [COLUMNS, *(row(d) for d in docs)]
    widths = [max(len(r[i]) for r in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def to_json(episodes: Iterable[Episode]) -> list[dict[str, Any]]:
    return [
        {
            "name": ep.name,
            "spec": msgspec.to_builtins(ep.spec),
            "status": msgspec.to_builtins(ep.status),
        }
        for ep in _ordered(episodes)
    ]


def pipeline(episodes: Iterable[Episode]) -> dict[str, int]:
    """Episodes per phase, every phase present (the status page's pipeline)."""
    counts = dict.fromkeys((p.value for p in Phase), 0)
    for ep in episodes:
        counts[ep.phase.value] += 1
    return counts
