"""The status page's JSON (``GET /api/v1/overview``): the whole fleet counted and grouped by
(state, node pool, reason) from the fleet cache (:mod:`gpuhealth.controller.fleet.cache`, the one
order and the same states as ``/api/v1/fleet``), then the nodes the page's filter selects
(``state``, ``pool``, ``reason``, ``label`` as in :mod:`gpuhealth.controller.fleet.query`), at most
:data:`gpuhealth.controller.status_page.page.OVERVIEW_NODES` of them, problem nodes first, with
their GPUs; the breaker document of ``/api/v1/breaker``, the idle tracker's last verdicts and the
activity log. Compact for the page: taints as ``key=value:Effect`` text, allocations as a
count, per GPU only what the grid shows, and only the NIC ports (rails) that are not well. A
GPU node that no agent has reported for yet appears with state ``unknown`` and no GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuhealth.controller.fleet.cache import CachedNode, FleetCache, Group
from gpuhealth.controller.fleet.health import port_name
from gpuhealth.controller.fleet.query import problems_first
from gpuhealth.controller.fleet.view import NodeStatus, taint_text
from gpuhealth.controller.status_page.activity import Activity, describe_gpu
from gpuhealth.protocol import severity

if TYPE_CHECKING:
    from gpuhealth.controller.fleet.model import GpuRecord
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
        "allocations_unknown": n.agent.allocations_unknown if n.agent is not None else None,
        "taints": sorted({taint_text(t) for t in n.ours}),
        "other_taints": sorted(taint_text(t) for t in n.foreign),
        "excluded": n.excluded,
        "rails": rails_json(n),
    }


def rails_json(n: NodeStatus) -> list[dict[str, Any]]:
    """The node's NIC ports that are not well (a rail verdict, a flap in the agent's window, or
    not ACTIVE): what the grid flags beside the node, with the GPUs behind each by index."""
    if n.agent is None:
        return []
    index = {g.info.uuid: g.info.index for g in n.gpus}
    return [
        {
            "port": port_name(p),
            "state": p.port_state,
            "phys_state": p.phys_state,
            "rate_gbps": p.rate_gbps,
            "flaps": p.flaps,
            "last_flap": _iso(p.last_flap),
            "verdicts": list(p.verdicts),
            "gpus": sorted(index[u] for u in p.gpus if u in index),
        }
        for p in n.agent.nics
        if p.verdicts or p.flaps or p.port_state not in ("", "ACTIVE")
    ]


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


def group_json(groups: Mapping[Group, int]) -> list[dict[str, Any]]:
    """Nodes by (state, pool, reason): the worst state first, then pool and reason."""
    return [
        {"state": state, "pool": pool, "reason": reason, "nodes": count}
        for (state, pool, reason), count in sorted(
            groups.items(), key=lambda kv: (-severity(kv[0][0]), kv[0][1], kv[0][2])
        )
    ]


def pick_shown(matches: Sequence[CachedNode], limit: int) -> list[CachedNode]:
    """At most ``limit`` of ``matches`` (in their order): all of them when they fit, else the
    nodes that are not healthy first, then healthy ones to fill."""
    return [matches[i] for i in problems_first([e.summary.state for e in matches], limit)]


def build_overview(
    cache: FleetCache,
    nodes: Sequence[dict[str, Any]],
    *,
    matched: int,
    prefix: str,
    now: datetime,
    breaker: dict[str, Any] | None = None,
    idle: Sequence[IdleAllocation] | None = None,
    activity: Sequence[Activity] = (),
    dry_run: bool = False,
    remediation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``cache`` counts and groups the whole fleet; ``nodes`` are the nodes listed with their
    GPUs (:func:`node_json` of :func:`pick_shown` of the ``matched`` nodes the page's filter
    selects).
    ``breaker`` is the ``/api/v1/breaker`` document (None: not reported by this
    controller); ``idle`` the idle tracker's last verdicts (None: idle detection is off);
    ``remediation`` the episode pipeline (``remediation.report.remediation_json``; None: the
    loop is off)."""
    return {
        "generated_at": now.isoformat(),
        "prefix": prefix,
        "dry_run": dry_run,
        "summary": {
            "nodes": len(cache),
            "gpus": cache.gpu_total(),
            "nodes_by_state": dict(cache.node_counts),
            "gpus_by_state": dict(cache.gpu_counts),
            "tainted_nodes": cache.tainted,
            "idle_allocations": len(idle or ()),
            "connected_agents": cache.connected,
        },
        "groups": group_json(cache.groups),
        "nodes_matched": matched,
        "nodes": list(nodes),
        "breaker": breaker,
        "idle": [idle_json(a) for a in idle] if idle is not None else None,
        "events": [a.to_json() for a in activity],
        "remediation": remediation,
    }
