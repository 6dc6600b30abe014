"""Episodes for people: rows for ``gpuhealth-controller status`` and JSON for the status
page and ``/api/v1/remediations`` (phase 2 wires both)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from gpuhealth.controller.remediation.model import TERMINAL_PHASES, Episode, Phase

COLUMNS = ("EPISODE", "NODE", "PHASE", "ACTION", "REASON", "IN PHASE", "EVICTED")


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    s = max(0, int((now - since).total_seconds()))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _rank(ep: Episode) -> int:
    """In progress, then waiting for a person (escalated, failed), then returned."""
    if ep.phase not in TERMINAL_PHASES:
        return 0
    return 2 if ep.phase is Phase.RETURNED else 1


def _ordered(episodes: Iterable[Episode]) -> list[Episode]:
    """By :func:`_rank`, then the most recent first."""
    return sorted(episodes, key=lambda e: (_rank(e), -e.spec.fault.detected_at.timestamp(), e.name))


def rows(episodes: Iterable[Episode], now: datetime) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for ep in _ordered(episodes):
        since = getattr(ep.status.times, ep.phase.value.lower(), None)
        out.append(
            (
                ep.name,
                ep.node,
                ep.phase.value,
                ep.spec.action,
                ep.status.reason,
                _age(since, now),
                str(ep.status.evicted_count),
            )
        )
    return out


def table(episodes: Iterable[Episode], now: datetime) -> str:
    lines: list[tuple[str, ...]] = [COLUMNS, *rows(episodes, now)]
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
