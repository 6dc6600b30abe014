"""What changed between two polls, as one line each for the terminal (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GpuStates = dict[str, dict[int, tuple[str, str]]]
"""Node -> GPU index -> (state, reason text)."""


def gpu_states(fleet: Mapping[str, Any]) -> GpuStates:
    """From the controller's ``/api/v1/fleet`` document."""
    out: GpuStates = {}
    for node in fleet.get("nodes") or []:
        gpus: dict[int, tuple[str, str]] = {}
        for g in node.get("gpus") or []:
            gpus[int(g.get("index", 0))] = (
                str(g.get("state", "unknown")),
                reasons(g.get("conditions") or []),
            )
        out[str(node.get("name"))] = gpus
    return out


def reasons(conditions: Iterable[Mapping[str, Any]]) -> str:
    """``xid-79 gpu-lost (RESTART_BM)``: the codes, then the distinct recommended actions."""
    conds = list(conditions)
    codes = " ".join(str(c.get("code") or c.get("reason") or "?") for c in conds)
    actions = sorted({str(c["action"]) for c in conds if c.get("action") not in (None, "NONE")})
    return codes + (f" ({', '.join(actions)})" if actions else "")


def gpu_changes(before: GpuStates, after: GpuStates) -> list[str]:
    lines = []
    for node in sorted(after):
        for index, (state, why) in sorted(after[node].items()):
            old = before.get(node, {}).get(index)
            if old is None:
                if state not in ("healthy", "unknown"):
                    lines.append(f"{node} GPU {index} reports {state}: {why}")
                continue
            if old[0] != state and not (old[0] == "unknown" and state == "healthy"):
                suffix = f": {why}" if why else ""
                lines.append(f"{node} GPU {index} {old[0]} -> {state}{suffix}")
    return lines


def taint_changes(
    before: Mapping[str, Iterable[str]], after: Mapping[str, Iterable[str]]
) -> list[str]:
    lines = []
    for node in sorted({*before, *after}):
        old, new = set(before.get(node, ())), set(after.get(node, ()))
        lines += [f"{node} tainted {t}" for t in sorted(new - old)]
        lines += [f"{node} untainted {t}" for t in sorted(old - new)]
    return lines


def our_taints(
    taints: Mapping[str, Iterable[Mapping[str, Any]]], prefix: str
) -> dict[str, list[str]]:
    return {
        node: sorted(
            f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
            for t in raw
            if str(t.get("key", "")).startswith(prefix + "/")
        )
        for node, raw in taints.items()
    }
