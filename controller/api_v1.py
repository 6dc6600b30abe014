"""``/api/v1/fleet`` and ``/api/v1/breaker``: the fleet and the circuit breaker as JSON for
people and tools (``gpuhealth-controller status``, the demo, ``curl``), and the breaker reset.

``GET /api/v1/fleet`` is :mod:`controller.fleet_view` in full: every node an agent spoke for
and every GPU node of the cluster, in natural name order, with its GPUs (state, conditions,
telemetry), allocations and the gpuhealth taints it carries; ``summary`` counts nodes and
GPUs by state; ``remediation`` the episode pipeline and the episodes when the loop is on.
``GET /api/v1/breaker`` is the breaker document, which the fleet and the status
page's overview embed unchanged. ``POST /api/v1/breaker/reset`` closes the breaker (leader
only; 409 elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from gpuhealth.common.clock import Clock
from gpuhealth.controller.breaker import BreakerStatus
from gpuhealth.controller.fleet_view import FleetView, NodeStatus
from gpuhealth.controller.remediation.model import Episode
from gpuhealth.controller.remediation.report import remediation_json
from gpuhealth.controller.settings import BreakerSettings

FLEET_PATH = "/api/v1/fleet"
BREAKER_PATH = "/api/v1/breaker"
BREAKER_RESET_PATH = "/api/v1/breaker/reset"


def _plain(obj: object) -> Any:
    return msgspec.to_builtins(obj)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def breaker_json(status: BreakerStatus, settings: BreakerSettings) -> dict[str, Any]:
    return {
        "enabled": settings.enabled,
        "open": status.open,
        "trips": status.trips,
        "tripped_at": _iso(status.tripped_at),
        "nodes_tainted_in_window": status.recent_nodes,
        "limit": status.limit,
        "max_fraction": settings.max_fraction,
        "window_s": settings.window_s,
        "blocked_nodes": list(status.blocked_nodes),
    }


def node_json(n: NodeStatus, now_mono: float) -> dict[str, Any]:
    rec = n.agent
    return {
        "name": n.name,
        "state": n.state,
        "agent": rec is not None,
        "connected": n.connected,
        "silent": n.silent,
        "has_snapshot": n.reporting,
        "last_seen_seconds_ago": round(now_mono - rec.last_seen, 3) if rec else None,
        "agent_version": rec.agent_version if rec else None,
        "in_cluster": n.node is not None,
        "excluded": n.excluded,
        "taints": [dict(t) for t in n.ours],
        "condition": _plain(n.condition) if n.condition else None,
        "gpus": [
            {
                "index": g.info.index,
                "uuid": g.info.uuid,
                "model": g.info.model,
                "pci_bus_id": g.info.pci_bus_id,
                "state": g.state,
                "since": _iso(g.state_since),
                "conditions": _plain(g.conditions),
                "telemetry": _plain(g.telemetry) if g.telemetry else None,
            }
            for g in n.gpus
        ],
        "allocations": _plain(n.allocations),
    }


def fleet_json(
    view: FleetView,
    breaker: dict[str, Any],
    *,
    now: datetime,
    now_mono: float,
    leader: bool,
    dry_run: bool,
    remediation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``remediation``: :func:`controller.remediation.report.remediation_json` (None: the
    loop is off)."""
    counts = view.counts()
    return {
        "generated": now.isoformat(),
        "leader": leader,
        "dry_run": dry_run,
        "breaker": breaker,
        "summary": {"nodes": counts.nodes, "gpus": counts.gpus},
        "nodes": [node_json(n, now_mono) for n in view.nodes],
        "remediation": remediation,
    }


@dataclass(frozen=True, slots=True)
class ApiV1:
    """The handlers, over the narrow reads and the one action they need."""

    fleet_view: Callable[[], FleetView]
    breaker_status: Callable[[], BreakerStatus]
    reset_breaker_and_requeue: Callable[[], list[str]]
    """Close the breaker and requeue the nodes it blocked (the reconciler's reset)."""
    breaker_settings: BreakerSettings
    is_leader: Callable[[], bool]
    dry_run: bool
    clock: Clock
    episodes: Callable[[], list[Episode]] | None = None
    """The GPURemediation watch cache (None: remediation is off)."""

    def breaker_document(self) -> dict[str, Any]:
        return breaker_json(self.breaker_status(), self.breaker_settings)

    def fleet_document(self) -> dict[str, Any]:
        return fleet_json(
            self.fleet_view(),
            self.breaker_document(),
            now=self.clock.now(),
            now_mono=self.clock.monotonic(),
            leader=self.is_leader(),
            dry_run=self.dry_run,
            remediation=(
                remediation_json(self.episodes(), self.clock.now())
                if self.episodes is not None
                else None
            ),
        )

    async def get_fleet(self, _req: web.Request) -> web.Response:
        return web.json_response(self.fleet_document())

    async def get_breaker(self, _req: web.Request) -> web.Response:
        return web.json_response(self.breaker_document())

    async def reset_breaker(self, _req: web.Request) -> web.Response:
        if not self.is_leader():
            return web.json_response(
                {"error": "not the leader; send the reset to the leader (the Service)"}, status=409
            )
        requeued = self.reset_breaker_and_requeue()
        return web.json_response({"reset": True, "requeued_blocked_nodes": requeued})

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(FLEET_PATH, self.get_fleet),
            web.get(BREAKER_PATH, self.get_breaker),
            web.post(BREAKER_RESET_PATH, self.reset_breaker),
        ]
