"""The agent's HTTP endpoints (contract: docs/architecture.md "Contracts").

``/metrics`` and ``/api/v1/status`` render the cached snapshot; neither touches NVML or the
kubelet. ``/healthz`` says the process and its supervised tasks are alive, ``/readyz`` that the
first inventory and poll have arrived.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth.agent.exposition import render
from gpuhealth.agent.health.rails import RailStatus
from gpuhealth.agent.node_snapshot import NodeSnapshot, NodeSnapshotCache
from gpuhealth.common.config import parse_listen
from gpuhealth.protocol import Condition

_json = msgspec.json.Encoder()
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format: every name is legacy-valid, and every Prometheus version reads it."""


def _condition(c: Condition) -> dict[str, Any]:
    return {
        "reason": c.reason,
        "code": c.code,
        "severity": c.severity,
        "xid": c.xid,
        "action": c.action,
        "message": c.message,
        "since": c.since,
    } | ({} if c.scope is None else {"scope": c.scope})


def _nic(p: RailStatus) -> dict[str, Any]:
    s = p.sample
    return {
        "device": s.device,
        "port": s.port,
        "link_layer": s.link_layer,
        "port_state": s.port_state,
        "phys_state": s.phys_state,
        "rate_gbps": s.rate_gbps,
        "expected_rate_gbps": p.expected_rate_gbps,
        "model": s.model,
        "netdev": s.netdev,
        "affinity": s.affinity,
        "gpus": [{"index": g.index, "uuid": g.uuid} for g in p.gpus],
        "flaps": p.flaps,
        "flaps_total": p.flaps_total,
        "last_flap": p.last_flap,
        "verdicts": [_condition(c) for c in p.verdicts],
        "counters": dict(sorted(s.counters.items())),
    }


def status_document(snap: NodeSnapshot) -> dict[str, Any]:
    """The ``/api/v1/status`` body: ``{"node", "gpus": [...], "nics": [...]}``, GPUs by index,
    the InfiniBand and RoCE ports by device and port."""
    return {
        "node": snap.node,
        "gpus": [
            {
                "index": st.info.index,
                "uuid": st.info.uuid,
                "pci_bus_id": st.info.pci_bus_id,
                "model": st.info.model,
                "state": st.state,
                "conditions": [_condition(c) for c in st.conditions],
            }
            for st in snap.statuses
        ],
        "nics": [_nic(p) for p in snap.nics],
    }


def build_app(
    state: NodeSnapshotCache, registry: CollectorRegistry, alive: Callable[[], bool]
) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = render(registry)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        ok = alive()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "tasks stopped\n")

    async def readyz(_: web.Request) -> web.Response:
        ok = state.ready
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "waiting\n")

    async def status(_: web.Request) -> web.Response:
        body = _json.encode(status_document(state.snapshot()))
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/status", status)
    return app


class HttpServer:
    """Serves :func:`build_app` until cancelled; ``port`` is the bound one (``:0`` in tests)."""

    def __init__(self, app: web.Application, listen: str) -> None:
        self._app = app
        self._host, self._port = parse_listen(listen)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
        await site.start()
        self._runner = runner
        addresses = runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
