"""``GET /api/v1/fleet`` and ``GET /api/v1/breaker``: the fleet as JSON for people and tools.

Every node an agent spoke for, and every GPU node in the cluster, with its GPUs (state,
conditions, telemetry), allocations and the gpuhealth taints the node carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gpuhealth.controller.breaker import CircuitBreaker
from gpuhealth.controller.fleet import NodeRecord
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.policy import Keys

if TYPE_CHECKING:
    from gpuhealth.controller.app import Controller


def _plain(obj: object) -> Any:
    return msgspec.to_builtins(obj)


def breaker_json(b: CircuitBreaker) -> dict[str, Any]:
    st = b.status()
    return {
        "enabled": b.settings.enabled,
        "open": st.open,
        "trips": st.trips,
        "tripped_at": st.tripped_at.isoformat() if st.tripped_at else None,
        "nodes_tainted_in_window": st.recent_nodes,
        "limit": st.limit,
        "max_fraction": b.settings.max_fraction,
        "window_s": b.settings.window_s,
        "blocked_nodes": list(st.blocked_nodes),
    }


def node_json(
    name: str, rec: NodeRecord | None, view: NodeView | None, keys: Keys, now_mono: float
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "state": rec.worst_state() if rec else "unknown",
        "agent": rec is not None,
        "connected": bool(rec and rec.connected),
        "silent": bool(rec and rec.silent),
        "has_snapshot": bool(rec and rec.has_snapshot),
        "last_seen_seconds_ago": round(now_mono - rec.last_seen, 3) if rec else None,
        "agent_version": rec.agent_version if rec else None,
        "in_cluster": view is not None,
        "excluded": bool(view and view.labels.get(keys.exclude_label) == "true"),
        "taints": [
            dict(t) for t in (view.taints if view else ()) if keys.owns(str(t.get("key", "")))
        ],
        "condition": _plain(view.condition) if view and view.condition else None,
        "gpus": [],
        "allocations": [],
    }
    if rec is not None:
        out["gpus"] = [
            {
                "index": g.info.index,
                "uuid": g.info.uuid,
                "model": g.info.model,
                "pci_bus_id": g.info.pci_bus_id,
                "state": g.state,
                "since": g.state_since.isoformat() if g.state_since else None,
                "conditions": _plain(g.conditions),
                "telemetry": _plain(g.telemetry) if g.telemetry else None,
            }
            for g in rec.gpus_by_index()
        ]
        out["allocations"] = _plain(rec.allocations)
    return out


def fleet_json(ctl: Controller) -> dict[str, Any]:
    names = {r.name for r in ctl.fleet.nodes()}
    names |= {v.name for v in ctl.cache.views() if v.gpus > 0}
    now = ctl.clock.monotonic()
    nodes = [
        node_json(n, ctl.fleet.node(n), ctl.cache.get(n), ctl.keys, now) for n in sorted(names)
    ]
    counts, gpus = ctl.fleet.counts()
    return {
        "generated": ctl.clock.now().isoformat(),
        "leader": ctl.is_leader,
        "dry_run": ctl.cfg.dry_run,
        "breaker": breaker_json(ctl.breaker),
        "summary": {"nodes": counts, "gpus": gpus},
        "nodes": nodes,
    }
