"""The status page's JSON (``GET /api/v1/overview``): a pure function of the fleet view
(:mod:`controller.fleet_view`: nodes, states, taints, counts, in the one order shared with
``/api/v1/fleet``), the breaker document of ``/api/v1/breaker``, the idle tracker's last
verdicts and the activity log. Compact for the page: taints as ``key=value:Effect`` text,
allocations as a count, per GPU only what the grid shows. A GPU node that no agent has
reported for yet appears with state ``unknown`` and no GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuhealth.controller.fleet_view import FleetView, NodeStatus, taint_text
from gpuhealth.controller.status_page.activity import Activity, describe_gpu

if TYPE_CHECKING:
    from gpuhealth.controller.fleet import GpuRecord
    from gpuhealth.controller.idle.tracker import IdleAllocation


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


def node_json(n: NodeStatus) -> dict[str, Any]:
    return {
        "name": n.name,
        "state": n.state,
        "connected": n.connected,
        "silent": n.silent,
        "reporting": n.reporting,
        "gpus": [gpu_json(g) for g in n.gpus],
        "allocations": len(n.allocations),
        "taints": sorted({taint_text(t) for t in n.ours}),
        "other_taints": sorted(taint_text(t) for t in n.foreign),
        "excluded": n.excluded,
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
    view: FleetView,
    *,
    prefix: str,
    now: datetime,
    breaker: dict[str, Any] | None = None,
    idle: Sequence[IdleAllocation] | None = None,
    activity: Sequence[Activity] = (),
    dry_run: bool = False,
    remediation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``breaker`` is the ``/api/v1/breaker`` document (None: not reported by this
    controller); ``idle`` the idle tracker's last verdicts (None: idle detection is off);
    ``remediation`` the episode pipeline (``remediation.report.remediation_json``; None: the
    loop is off)."""
    counts = view.counts()
    return {
        "generated_at": now.isoformat(),
        "prefix": prefix,
        "dry_run": dry_run,
        "summary": {
            "nodes": len(view.nodes),
            "gpus": view.gpu_count(),
            "nodes_by_state": counts.nodes,
            "gpus_by_state": counts.gpus,
            "tainted_nodes": sum(1 for n in view.nodes if n.ours),
            "idle_allocations": len(idle or ()),
            "connected_agents": sum(1 for n in view.nodes if n.connected),
        },
        "nodes": [node_json(n) for n in view.nodes],
        "breaker": breaker,
        "idle": [idle_json(a) for a in idle] if idle is not None else None,
        "events": [a.to_json() for a in activity],
        "remediation": remediation,
    }
