"""aiohttp routes of the status page: ``/``, ``/static/…`` and ``GET /api/v1/overview``.

The page is static HTML/CSS/JS from ``static/`` in this package; its script polls the
overview JSON and redraws. It reads the fleet, the node watch cache, the circuit breaker and
the idle tracker through the narrow protocols below, and never changes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from aiohttp import web

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.controller.fleet.cache import CachedNode, FleetCache
from gpuhealth.controller.fleet.query import FleetQuery, QueryError, parse_query
from gpuhealth.controller.fleet.view import node_status
from gpuhealth.controller.http.api import breaker_json, node_fragment
from gpuhealth.controller.incidents.model import Incident, IncidentBook, IncidentReader
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.summary import remediation_json
from gpuhealth.controller.status_page.activity import (
    DEFAULT_CAPACITY,
    ActivityLog,
    NodeViewReader,
    Severity,
)
from gpuhealth.controller.status_page.overview import build_overview, node_json, pick_shown

if TYPE_CHECKING:
    from gpuhealth.controller.breaker.gate import BreakerStatus
    from gpuhealth.controller.fleet.model import FleetReader
    from gpuhealth.controller.idle.tracker import IdleAllocation
    from gpuhealth.controller.kube.node_cache import NodeListener
    from gpuhealth.controller.kube.node_view import NodeView
    from gpuhealth.controller.remediation.model import Episode

OVERVIEW_PATH = "/api/v1/overview"
STATIC_FILES = {
    "app.js": "application/javascript",
    "style.css": "text/css",
}
ACTIVITY_SHOWN = 50
"""Activity entries included in one overview response."""
OVERVIEW_CACHE_S = 1.0
"""An overview (per filter) is built at most this often and shared by every open page with
that filter (each polls every 2 s)."""
OVERVIEW_NODES = 200
"""Nodes listed with their GPUs in one overview (problem nodes first); the rest are counted
in the groups and reached by filtering."""
OVERVIEW_CHUNK = 25
"""Nodes of an overview rendered between two yields to the event loop."""
OVERVIEW_CACHED_QUERIES = 32
"""Distinct filters whose overview is kept for ``cache_s`` (the oldest is dropped first)."""


class BreakerReader(Protocol):
    """What the page reads of the circuit breaker
    (``gpuhealth.controller.breaker.gate.CircuitBreaker``)."""

    def status(self) -> BreakerStatus: ...


class IdleReader(Protocol):
    """The idle tracker's last evaluation (``controller.idle_tracker.IdleTracker``)."""

    def idle_allocations(self) -> list[IdleAllocation]: ...


class _NoNodes:
    """No node watch cache: only the nodes agents report."""

    def get(self, _name: str) -> NodeView | None:
        return None

    def views(self) -> list[NodeView]:
        return []

    def subscribe(self, listener: NodeListener) -> None:
        pass


ALL = FleetQuery()


def _static(name: str) -> bytes:
    return resources.files("gpuhealth.controller.status_page").joinpath("static", name).read_bytes()


@dataclass
class StatusPage:
    fleet: FleetReader
    keys: Keys = field(default_factory=Keys)
    nodes: NodeViewReader | None = None
    breaker: BreakerReader | None = None
    idle: IdleReader | None = None
    dry_run: bool = False
    clock: Clock = field(default_factory=SystemClock)
    episodes: Callable[[], list[Episode]] | None = None
    """The GPURemediation watch cache (None: remediation is off)."""
    cache_s: float = OVERVIEW_CACHE_S
    fleet_cache: FleetCache | None = None
    """The controller's fleet cache (shared with ``/api/v1/fleet``); None: one of its own."""
    incidents: IncidentReader | None = None
    """The fleet-level incidents (``gpuhealth.controller.incidents``), as the API shows them."""
    incident_book: IncidentBook | None = None
    """This replica's book: its incidents opened and closed are noted as activity."""
    activity: ActivityLog = field(init=False)
    _cached: dict[str, tuple[float, bytes]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.activity = ActivityLog(self.keys, DEFAULT_CAPACITY, self.clock)
        self.activity.attach_fleet(self.fleet)
        if self.nodes is not None:
            self.activity.attach_nodes(self.nodes)
        if self.fleet_cache is None:
            self.fleet_cache = FleetCache(
                self.fleet, self.nodes or _NoNodes(), self.keys, node_fragment
            )
        if self.incident_book is not None:
            self.incident_book.subscribe(self._incident_changed)

    def _incident_changed(self, change: str, incident: Incident) -> None:
        """Opened and closed incidents are noted in the activity log."""
        if change == "updated":
            return
        node = incident.subjects.nodes[0] if len(incident.subjects.nodes) == 1 else ""
        severity: Severity = "warning" if change == "opened" else "info"
        self.activity.note(
            node,
            "incident",
            severity,
            f"{incident.kind} incident {change}: {incident.decision} — {incident.reason}",
        )

    @property
    def cache(self) -> FleetCache:
        assert self.fleet_cache is not None
        return self.fleet_cache

    @staticmethod
    def _shown(matches: list[CachedNode]) -> tuple[list[str], int]:
        """The names of the nodes listed with their GPUs, and how many the filter matches."""
        return [e.summary.name for e in pick_shown(matches, OVERVIEW_NODES)], len(matches)

    def _node_json(self, name: str) -> dict[str, Any]:
        view = self.nodes.get(name) if self.nodes is not None else None
        return node_json(node_status(name, self.fleet.node(name), view, self.keys))

    def overview(self, query: FleetQuery = ALL) -> dict[str, object]:
        """The overview for ``query``'s filter (the cache is brought up to date first)."""
        self.cache.refresh_all()
        names, matched = self._shown(self.cache.select(FleetQuery(filter=query.filter)).nodes)
        return self._document([self._node_json(n) for n in names], matched)

    async def overview_async(self, query: FleetQuery = ALL) -> dict[str, object]:
        """:meth:`overview`, yielding to the event loop between chunks of nodes."""
        await self.cache.refresh()
        names, matched = self._shown((await self.cache.scan(FleetQuery(filter=query.filter))).nodes)
        nodes: list[dict[str, Any]] = []
        for start in range(0, len(names), OVERVIEW_CHUNK):
            if start:
                await asyncio.sleep(0)
            nodes += [self._node_json(n) for n in names[start : start + OVERVIEW_CHUNK]]
        return self._document(nodes, matched)

    async def overview_for(self, params: Iterable[tuple[str, str]]) -> dict[str, object]:
        """:meth:`overview_async` for query parameters (what a merged read past one process
        takes of this replica's own shards, :mod:`gpuhealth.controller.shards.reads`);
        :class:`QueryError` for bad ones."""
        return await self.overview_async(parse_query(params))

    def _document(self, nodes: list[dict[str, Any]], matched: int) -> dict[str, object]:
        status = self.breaker.status() if self.breaker is not None else None
        idle = self.idle.idle_allocations() if self.idle is not None else None
        if status is not None:
            self.activity.observe_breaker(status)
        if idle is not None:
            self.activity.observe_idle(idle)
        doc = build_overview(
            self.cache,
            nodes,
            matched=matched,
            prefix=self.keys.prefix,
            now=self.clock.now(),
            breaker=(
                breaker_json(status) if status is not None and self.breaker is not None else None
            ),
            idle=idle,
            activity=self.activity.recent(ACTIVITY_SHOWN),
            dry_run=self.dry_run,
            remediation=(
                remediation_json(self.episodes(), self.clock.now())
                if self.episodes is not None
                else None
            ),
        )
        now = self.clock.now()
        doc["incidents"] = (
            [i.to_dict(now) for i in self.incidents.list()] if self.incidents is not None else []
        )
        return doc

    async def handle_index(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=_static("index.html"),
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def handle_static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        ctype = STATIC_FILES.get(name)
        if ctype is None:
            raise web.HTTPNotFound()
        return web.Response(
            body=_static(name),
            content_type=ctype,
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    def cached_overview(self, key: str) -> bytes | None:
        """The encoded overview for the query string ``key`` if built within ``cache_s``."""
        hit = self._cached.get(key)
        if hit is not None and self.clock.monotonic() - hit[0] < self.cache_s:
            return hit[1]
        return None

    def keep_overview(self, key: str, body: bytes) -> bytes:
        self._cached.pop(key, None)
        self._cached[key] = (self.clock.monotonic(), body)
        while len(self._cached) > OVERVIEW_CACHED_QUERIES:
            del self._cached[next(iter(self._cached))]
        return body

    def overview_json(self, query: FleetQuery = ALL, key: str = "") -> bytes:
        """The encoded overview for ``query`` (``key``: its query string), rebuilt at most
        every ``cache_s`` seconds."""
        body = self.cached_overview(key)
        if body is None:
            body = self.keep_overview(key, msgspec.json.encode(self.overview(query)))
        return body

    async def handle_overview(self, request: web.Request) -> web.StreamResponse:
        try:
            query = parse_query(request.query.items())
        except QueryError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        key = request.query_string
        body = self.cached_overview(key)
        if body is None:
            doc = await self.overview_async(query)
            body = self.keep_overview(key, msgspec.json.encode(doc))
        resp = web.Response(
            body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
        )
        resp.enable_compression()
        return resp

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.handle_index)
        app.router.add_get("/static/{name}", self.handle_static)
        app.router.add_get(OVERVIEW_PATH, self.handle_overview)


def register(
    app: web.Application,
    fleet: FleetReader,
    *,
    keys: Keys | None = None,
    nodes: NodeViewReader | None = None,
    breaker: BreakerReader | None = None,
    idle: IdleReader | None = None,
    dry_run: bool = False,
    clock: Clock | None = None,
    cache_s: float = OVERVIEW_CACHE_S,
    episodes: Callable[[], list[Episode]] | None = None,
    fleet_cache: FleetCache | None = None,
) -> StatusPage:
    """Mount the status page on ``app`` and start recording recent activity.

    ``nodes`` is the node watch cache (taints), ``breaker`` the circuit breaker, ``idle``
    the idle tracker and ``episodes`` the GPURemediation watch cache; each may be None (its
    panel then says so).
    """
    page = StatusPage(
        fleet=fleet,
        keys=keys or Keys(),
        nodes=nodes,
        breaker=breaker,
        idle=idle,
        dry_run=dry_run,
        clock=clock or SystemClock(),
        cache_s=cache_s,
        episodes=episodes,
        fleet_cache=fleet_cache,
    )
    page.add_routes(app)
    return page
