"""The controller's one HTTP application (``--listen``): every route, grouped by who calls it.

- Probes and metrics (kubelet, Prometheus): ``/healthz`` (background tasks alive),
  ``/readyz`` (200 only on the leader that has loaded its state: the breaker, the incidents;
  with a synced node cache),
  ``/readyz/replica`` (200 on
  every replica that could serve or take over: tasks alive, node cache synced — the chart's
  readiness probe; traffic reaches the leader through the endpoint it publishes,
  :mod:`gpuhealth.controller.leadership.endpoint`), ``/metrics``.
- People and tools, read-only: ``GET /api/v1/fleet``, ``GET /api/v1/breaker``
  (:mod:`gpuhealth.controller.http.api`), the status page ``/`` and ``GET /api/v1/overview``
  (:mod:`gpuhealth.controller.status_page`).
- Operators, changing state: ``POST /api/v1/breaker/reset``.

Every request first passes the ``middlewares`` handed in, outermost first: the slow-client
bounds (:mod:`gpuhealth.controller.http.limits`), then authentication and authorization
(:mod:`gpuhealth.controller.http.auth`, the table in :mod:`gpuhealth.controller.http.access`): every
state-changing endpoint needs a token that may, read-only ones only with
``http.auth.reads: authorized``; probes, the stream and the extender are open.
- Agents: the WebSocket ``/v1/stream`` (each connection authenticated by a TokenReview,
  :mod:`gpuhealth.controller.stream`).
- kube-scheduler: ``/scheduler/filter`` and ``/scheduler/prioritize``
  (:mod:`gpuhealth.controller.placement`).

:func:`build_http_app` is the one place that sees every route: authentication and
authorization of HTTP callers are its middlewares, in front of the groups above.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuhealth.controller.http.api import ApiV1

Mount = Callable[[web.Application], None]
"""Adds a part's routes (and shutdown hooks) to the application."""


class TaskHealth(Protocol):
    """The supervisor of the background tasks (:class:`gpuhealth.common.tasks.Supervisor`)."""

    def healthy(self) -> bool: ...

    def status(self) -> dict[str, dict[str, object]]: ...


@dataclass(frozen=True, slots=True)
class Probes:
    """``/healthz``, ``/readyz`` and ``/metrics``."""

    registry: CollectorRegistry
    tasks: TaskHealth
    is_leader: Callable[[], bool]
    """Holds the Lease."""
    leader_ready: Callable[[], bool]
    """Holds the Lease and its leader work has prepared (the breaker's stored state loaded,
    the incidents adopted: ``LeaderWork.ready``)."""
    synced: Callable[[], bool]
    """The node cache has listed every Node."""
    node_series: Callable[[], bytes] = bytes
    """The per-node series, written after the registry's (``GaugeCollector.node_series``)."""
    before_scrape: Callable[[], Awaitable[None]] | None = None
    """Brings what the scrape reads up to date in slices between yields to the event loop
    (the fleet cache's :meth:`~gpuhealth.controller.fleet.cache.FleetCache.refresh`): the scrape
    itself is one synchronous call, and after a storm every node of the fleet is dirty (at
    19,000 nodes re-encoding them all in one go held the loop for 1.2 s)."""

    async def metrics(self, _req: web.Request) -> web.Response:
        if self.before_scrape is not None:
            await self.before_scrape()
        body = generate_latest(self.registry) + self.node_series()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, _req: web.Request) -> web.Response:
        ok = self.tasks.healthy()
        return web.json_response(
            {"ok": ok, "tasks": self.tasks.status()}, status=200 if ok else 503
        )

    async def readyz(self, _req: web.Request) -> web.Response:
        leader, ready, synced = self.is_leader(), self.leader_ready(), self.synced()
        return web.json_response(
            {"leader": leader, "leader_ready": ready, "synced": synced},
            status=200 if ready and synced else 503,
        )

    async def replica_readyz(self, _req: web.Request) -> web.Response:
        ok, synced = self.tasks.healthy(), self.synced()
        return web.json_response(
            {"ok": ok, "synced": synced, "leader": self.is_leader()},
            status=200 if ok and synced else 503,
        )

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/metrics", self.metrics),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/readyz/replica", self.replica_readyz),
        ]


def build_http_app(
    *,
    max_body_bytes: int,
    probes: Probes,
    api: ApiV1,
    status_page: Mount,
    agents: Mount,
    scheduler: Sequence[web.RouteDef] = (),
    middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The application; ``max_body_bytes`` is aiohttp's limit on a request body (the
    slow-client middleware lowers or raises it per route),
    ``scheduler`` is empty when the extender is disabled, ``middlewares`` run in front of
    every route, the first outermost."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=list(middlewares))
    app.add_routes(probes.routes())
    app.add_routes(api.routes())
    status_page(app)
    agents(app)
    app.add_routes(scheduler)
    return app
