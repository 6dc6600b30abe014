"""The controller process: every part around one ApiClient, its HTTP app, start and stop.

HTTP (``--listen``): ``/metrics``, ``/healthz`` (tasks alive), ``/readyz`` (200 only on the
leader, so a Service sends agents to it), ``GET /api/v1/fleet``, ``GET /api/v1/breaker``,
``POST /api/v1/breaker/reset``, the agents' ``/v1/stream`` and the scheduler extender.
Background work runs as named, supervised tasks: the node watch, the silence checker and
leader election; the reconciler and DRA run only while this replica leads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor
from gpuhealth.controller import breaker_sync
from gpuhealth.controller.api_v1 import breaker_json, fleet_json
from gpuhealth.controller.breaker import CircuitBreaker
from gpuhealth.controller.config import ControllerConfig
from gpuhealth.controller.fleet import Fleet
from gpuhealth.controller.fleet_view import build_fleet_view
from gpuhealth.controller.kube.breaker_store import BreakerStore
from gpuhealth.controller.kube.dra import DeviceTaints
from gpuhealth.controller.kube.nodes import NodeApi
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.watch import NodeCache
from gpuhealth.controller.leader import LeaderElector
from gpuhealth.controller.metrics import ControllerMetrics, StateCollector, StateSources
from gpuhealth.controller.policy import Keys
from gpuhealth.controller.reconciler import Reconciler

log = get_logger("app")

TaskFactory = Callable[[], Awaitable[None]]


class Controller:
    def __init__(
        self,
        cfg: ControllerConfig,
        api: ApiClient,
        *,
        clock: Clock | None = None,
        identity: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.api = api
        self.clock = clock or SystemClock()
        self.keys = Keys(cfg.prefix)
        self.fleet = Fleet(cfg.fleet, self.clock)
        self.cache = NodeCache(api, cfg.watch, gpu_resource=cfg.gpu_resource, clock=self.clock)
        self.nodes = NodeApi(
            api,
            gpu_resource=cfg.gpu_resource,
            timeout_s=cfg.reconciler.request_timeout_s,
            events_namespace=cfg.events_namespace,
        )
        self.breaker = CircuitBreaker(cfg.breaker, self.clock)
        self.breaker_store = BreakerStore(
            api,
            cfg.leader.namespace,
            cfg.breaker.configmap,
            timeout_s=cfg.reconciler.request_timeout_s,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.metrics = ControllerMetrics(self.registry)
        self.dra = (
            DeviceTaints(
                api,
                cfg.dra,
                self.keys,
                clock=self.clock,
                timeout_s=cfg.reconciler.request_timeout_s,
            )
            if cfg.dra.enabled
            else None
        )
        self.reconciler = Reconciler(
            cfg,
            self.fleet,
            self.cache,
            self.nodes,
            breaker=self.breaker,
            metrics=self.metrics,
            clock=self.clock,
            devices=self.dra,
        )
        self.elector = LeaderElector(
            api, cfg.leader, identity or cfg.leader_identity(), self._lead, clock=self.clock
        )
        self.supervisor = Supervisor(clock=self.clock)
        self.leader_tasks: dict[str, TaskFactory] = {}
        """Extra work that runs only while leading (e.g. idle-allocation writes)."""
        self.tasks: dict[str, TaskFactory] = {}
        """Extra work that runs on every replica."""
        self.routes: list[web.RouteDef] = []
        """Extra HTTP routes (stream server, scheduler extender ...)."""
        self.apps: list[Callable[[web.Application], None]] = []
        """Callbacks that mount something on the aiohttp application."""
        self.registry.register(
            StateCollector(
                StateSources(
                    fleet=self.fleet,
                    breaker=self.breaker,
                    keys=self.keys,
                    is_leader=lambda: self.elector.is_leader,
                    node_views=self.cache.views,
                    dra_rules=lambda: self.dra.rule_count() if self.dra else 0,
                )
            )
        )

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader

    async def _lead(self) -> None:
        await self.cache.synced.wait()
        log.info("leader_work_starting", nodes=len(self.cache.names()), dry_run=self.cfg.dry_run)
        persist = self.cfg.breaker.enabled and not self.cfg.dry_run
        if persist:
            await breaker_sync.adopt(self.breaker, self.breaker_store)
        async with asyncio.TaskGroup() as tg:
            if persist:
                tg.create_task(
                    breaker_sync.sync(
                        self.breaker, self.breaker_store, self.reconciler, self.clock
                    ),
                    name="breaker-state",
                )
            tg.create_task(self.reconciler.run(), name="reconciler")
            if self.dra is not None and not self.cfg.dry_run:
                tg.create_task(self.dra.run(), name="dra-device-taints")
            for name, factory in self.leader_tasks.items():
                tg.create_task(factory(), name=name)  # type: ignore[arg-type]

    async def start(self) -> None:
        self.supervisor.start("node-watch", self.cache.run)
        self.supervisor.start("fleet-silence", self.fleet.run_silence_checker)
        self.supervisor.start("leader-election", self.elector.run)
        for name, factory in self.tasks.items():
            self.supervisor.start(name, factory)

    async def stop(self) -> None:
        await self.supervisor.stop(timeout=self.cfg.shutdown_timeout_s)
        await self.elector.release()
        await self.reconciler.queue.close()
        await self.reconciler.status_queue.close()
        if self.dra is not None:
            await self.dra.queue.close()

    # -- HTTP ---------------------------------------------------------------------------------

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.extender.max_body_bytes)
        app.add_routes(
            [
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/api/v1/fleet", self._fleet),
                web.get("/api/v1/breaker", self._breaker),
                web.post("/api/v1/breaker/reset", self._breaker_reset),
            ]
        )
        app.add_routes(self.routes)
        for mount in self.apps:
            mount(app)
        return app

    async def _metrics(self, _req: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _req: web.Request) -> web.Response:
        ok = self.supervisor.healthy()
        return web.json_response(
            {"ok": ok, "tasks": self.supervisor.status()}, status=200 if ok else 503
        )

    async def _readyz(self, _req: web.Request) -> web.Response:
        ready = self.is_leader and self.cache.synced.is_set()
        return web.json_response(
            {"leader": self.is_leader, "synced": self.cache.synced.is_set()},
            status=200 if ready else 503,
        )

    async def _fleet(self, _req: web.Request) -> web.Response:
        view = build_fleet_view(self.fleet, self.cache.views(), self.keys)
        breaker = breaker_json(self.breaker.status(), self.breaker.settings)
        doc = fleet_json(
            view,
            breaker,
            now=self.clock.now(),
            now_mono=self.clock.monotonic(),
            leader=self.is_leader,
            dry_run=self.cfg.dry_run,
        )
        return web.json_response(doc)

    async def _breaker(self, _req: web.Request) -> web.Response:
        return web.json_response(breaker_json(self.breaker.status(), self.breaker.settings))

    async def _breaker_reset(self, _req: web.Request) -> web.Response:
        if not self.is_leader:
            return web.json_response(
                {"error": "not the leader; send the reset to the leader (the Service)"}, status=409
            )
        requeued = self.reconciler.reset_breaker()
        body: dict[str, Any] = {"reset": True, "requeued_blocked_nodes": requeued}
        return web.json_response(body)


def wire_agents_and_placement(ctl: Controller) -> None:
    """Mount the agents' stream (TokenReview auth, feeding the fleet), the extender and
    idle-allocation tracking (pod writes only on the leader, never in dry-run)."""
    from gpuhealth.controller.idle_tracker import IdleTracker
    from gpuhealth.controller.kube.pods import PodApi
    from gpuhealth.controller.kube.tokenreview import TokenReviewAuthenticator
    from gpuhealth.controller.placement import (
        ExtenderCollector,
        ExtenderHandlers,
        ExtenderMetrics,
        PlacementIndex,
        extender_routes,
    )
    from gpuhealth.controller.status_page import for_controller
    from gpuhealth.controller.stream.metrics import StreamServerCollector, StreamServerMetrics
    from gpuhealth.controller.stream.server import StreamServer

    auth = TokenReviewAuthenticator(ctl.api, ctl.cfg.stream.audience)
    stream_metrics = StreamServerMetrics()
    stream = StreamServer(ctl.cfg.stream, auth, ctl.fleet, clock=ctl.clock, metrics=stream_metrics)
    ctl.apps.append(stream.add_routes)
    ctl.add_collector(StreamServerCollector(stream_metrics))
    if ctl.cfg.extender.enabled:
        index = PlacementIndex(ctl.fleet, ctl.cfg.extender)
        ext_metrics = ExtenderMetrics()
        handlers = ExtenderHandlers(lambda: index.summaries, ctl.cfg.extender, ext_metrics)
        ctl.routes.extend(extender_routes(handlers))
        ctl.add_collector(ExtenderCollector(ext_metrics))
    if ctl.cfg.idle.enabled:
        tracker = IdleTracker(
            ctl.cfg.idle,
            ctl.clock,
            writer=PodApi(ctl.api, request_timeout_s=ctl.cfg.reconciler.request_timeout_s),
            should_act=lambda: ctl.is_leader and not ctl.cfg.dry_run,
        )
        tracker.attach(ctl.fleet)
        ctl.tasks["idle-tracker"] = tracker.run
        ctl.add_collector(tracker.collector())
    # The status page at / (controller/web): reads the fleet, node cache, breaker, idle tracker.
    ctl.apps.append(for_controller(ctl, idle=tracker if ctl.cfg.idle.enabled else None))
