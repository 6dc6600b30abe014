"""The status page's JSON (``GET /api/v1/overview``): a pure function of what the controller
already holds — fleet state, the node watch cache (taints), the circuit breaker, the idle
tracker's last verdicts and the activity log.

Nodes are listed by name (a stable grid), GPUs by index; a GPU node that no agent has
reported for yet appears with state ``unknown`` and no GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuhealth.controller.status_page.activity import Activity, describe_gpu, owned_taints
from gpuhealth.protocol import HEALTH_STATES

if TYPE_CHECKING:
    from gpuhealth.controller.breaker import BreakerStatus
    from gpuhealth.controller.fleet import Fleet, GpuRecord, NodeRecord
    from gpuhealth.controller.idle_tracker import IdleAllocation
    from gpuhealth.controller.kube.node_view import NodeView

_NUM = re.compile(r"(\d+)")


def natural_key(name: str) -> list[Any]:
    """``gpu-node-2`` before ``gpu-node-10``."""
    return [int(p) if p.isdigit() else p for p in _NUM.split(name)]


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def gpu_json(g: GpuRecord) -> dict[str, Any]:
    tel = g.telemetry
    return {
        "index": g.info.index,
        "uuid": g.info.uuid,
        "model": g.info.model,
        "state": g.state,
        "since": _iso(g.state_since),
        "summary": describe_gpu(g),
        "conditions": [
            {
                "reason": c.reason,
                "code": c.code,
                "severity": c.severity,
                "message": c.message,
                "action": c.action,
                "xid": c.xid,
            }
            for c in g.conditions
        ],
        "temperature_c": tel.temperature_c if tel else None,
        "utilization_ratio": tel.utilization_ratio if tel else None,
    }


def node_json(
    name: str, rec: NodeRecord | None, view: NodeView | None, prefix: str
) -> dict[str, Any]:
    taints = [dict(t) for t in view.taints] if view is not None else []
    ours = sorted(owned_taints(taints, prefix))
    return {
        "name": name,
        "state": rec.worst_state() if rec is not None else "unknown",
        "connected": rec.connected if rec is not None else False,
        "silent": rec.silent if rec is not None else False,
        "reporting": rec is not None and rec.has_snapshot,
        "gpus": [gpu_json(g) for g in rec.gpus_by_index()] if rec is not None else [],
        "allocations": len(rec.allocations) if rec is not None else 0,
        "taints": ours,
        "other_taints": sorted(
            f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
            for t in taints
            if not str(t.get("key", "")).startswith(prefix + "/")
        ),
        "excluded": view is not None and view.labels.get(f"{prefix}/exclude") == "true",
    }


def breaker_json(status: BreakerStatus | None, enabled: bool) -> dict[str, Any] | None:
    if status is None:
        return None
    return {
        "enabled": enabled,
        "open": status.open,
        "trips": status.trips,
        "tripped_at": _iso(status.tripped_at),
        "recent_nodes": status.recent_nodes,
        "limit": status.limit,
        "blocked_nodes": list(status.blocked_nodes),
    }


def idle_json(a: IdleAllocation) -> dict[str, Any]:
    return {
        "namespace": a.namespace,
        "pod": a.pod,
        "container": a.container,
        "node": a.node,
        "gpu": a.gpu,
        "uuid": a.uuid,
        "idle_for_s": round(a.idle_for_s, 1),
        "threshold_ratio": a.threshold_ratio,
        "window_s": a.window_s,
    }


def build_overview(
    fleet: Fleet,
    *,
    prefix: str,
    now: datetime,
    views: Iterable[NodeView] = (),
    breaker: BreakerStatus | None = None,
    breaker_enabled: bool = True,
    idle: Sequence[IdleAllocation] | None = None,
    activity: Sequence[Activity] = (),
    dry_run: bool = False,
) -> dict[str, Any]:
    by_view = {v.name: v for v in views if v.gpus > 0 or fleet.node(v.name) is not None}
    names = sorted({*by_view, *(r.name for r in fleet.nodes())}, key=natural_key)
    nodes = [node_json(n, fleet.node(n), by_view.get(n), prefix) for n in names]
    node_counts = dict.fromkeys(HEALTH_STATES, 0)
    gpu_counts = dict.fromkeys(HEALTH_STATES, 0)
    for n in nodes:
        node_counts[n["state"]] += 1
        for g in n["gpus"]:
            gpu_counts["unknown" if n["silent"] else g["state"]] += 1
    return {
        "generated_at": now.isoformat(),
        "prefix": prefix,
        "dry_run": dry_run,
        "summary": {
            "nodes": len(nodes),
            "gpus": sum(len(n["gpus"]) for n in nodes),
            "nodes_by_state": node_counts,
            "gpus_by_state": gpu_counts,
            "tainted_nodes": sum(1 for n in nodes if n["taints"]),
            "idle_allocations": len(idle or ()),
            "connected_agents": sum(1 for n in nodes if n["connected"]),
        },
        "nodes": nodes,
        "breaker": breaker_json(breaker, breaker_enabled),
        "idle": [idle_json(a) for a in idle] if idle is not None else None,
        "events": [a.to_json() for a in activity],
    }
