"""``/api/v1/fleet`` and ``/api/v1/breaker``: the fleet and the circuit breaker as JSON for
people and tools (``gpuhealth-controller status``, the demo, ``curl``), and the breaker reset.

``GET /api/v1/fleet`` is :mod:`gpuhealth.controller.fleet.view`: every node an agent spoke for and
every GPU node of the cluster, in natural name order, with its GPUs (state, conditions,
telemetry), allocations, its InfiniBand and RoCE ports (``nics``: state, rate, flaps, rail
verdicts and the GPUs behind each, as its agent's Snapshot says) and the gpuhealth taints it
carries; ``summary`` counts nodes and
GPUs by state (the whole fleet); ``remediation`` the episode pipeline and the episodes when
the loop is on. It is served from :mod:`gpuhealth.controller.fleet.cache` (per-node encoded
fragments, concatenated and written in chunks, gzip-compressed off the event loop when the
client accepts it), and takes the filters and pages of :mod:`gpuhealth.controller.fleet.query`
(``state``, ``pool``, ``reason``, ``label``, ``limit``, ``continue``; the answer's
``continue`` asks for the next page); without parameters, the whole fleet.
``incidents`` lists the open fleet-level incidents (:mod:`gpuhealth.controller.incidents`: job, GPU,
NVLink domain, unwatched node, a taint removed by hand) with what was decided and why,
on-call's ``lifecycle`` (acknowledged by, silenced until, resolved by) and whether each
``paging``; ``GET /api/v1/incidents`` lists them with the recently closed ones
(``?state=open`` for the open ones only). Every replica shows the same: the leader its book,
another replica the GPUIncident objects of its watch.
Past one process (``shards.count`` > 1) :class:`gpuhealth.controller.shards.reads.MergedReads`
answers ``/api/v1/fleet`` for the whole fleet in front of these handlers (``scope=local``:
this replica's own shards, :meth:`ApiV1.fleet_page`).
``GET /api/v1/breaker`` is the breaker document, which the fleet and the status
page's overview embed unchanged. ``POST /api/v1/breaker/reset`` closes the breaker (leader
only; 409 elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from gpuhealth.common.clock import Clock
from gpuhealth.controller.breaker.gate import BreakerStatus
from gpuhealth.controller.fleet.cache import CachedNode, FleetCache, Page
from gpuhealth.controller.fleet.model import NodeRecord
from gpuhealth.controller.fleet.query import FleetQuery, QueryError, encode_continue, parse_query
from gpuhealth.controller.fleet.view import FleetView, NodeStatus
from gpuhealth.controller.incidents.model import IncidentReader
from gpuhealth.controller.remediation.model import Episode
from gpuhealth.controller.remediation.summary import remediation_json

FLEET_PATH = "/api/v1/fleet"
BREAKER_PATH = "/api/v1/breaker"
BREAKER_RESET_PATH = "/api/v1/breaker/reset"
INCIDENTS_PATH = "/api/v1/incidents"


_encode = msgspec.json.Encoder().encode


def _plain(obj: object) -> Any:
    return msgspec.to_builtins(obj)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def breaker_json(status: BreakerStatus) -> dict[str, Any]:
    return {
        "enabled": status.enabled,
        "open": status.open,
        "trips": status.trips,
        "tripped_at": _iso(status.tripped_at),
        "nodes_tainted_in_window": status.recent_nodes,
        "limit": status.limit,
        "max_fraction": status.max_fraction,
        "window_s": status.window_s,
        "blocked_nodes": list(status.blocked_nodes),
        "pools": [
            {
                "pool": p.pool,
                "open": p.open,
                "nodes_tainted_in_window": p.recent_nodes,
                "limit": p.limit,
                "tripped_at": _iso(p.tripped_at),
            }
            for p in status.pools
        ],
    }


def node_body(n: NodeStatus) -> dict[str, Any]:
    """A node of ``/api/v1/fleet`` without ``last_seen_seconds_ago`` (the one field that
    changes with the time alone); protocol structs left for the encoder."""
    rec = n.agent
    return {
        "name": n.name,
        "state": n.state,
        "agent": rec is not None,
        "connected": n.connected,
        "silent": n.silent,
        "has_snapshot": n.reporting,
        "agent_version": rec.agent_version if rec else None,
        "in_cluster": n.node is not None,
        "excluded": n.excluded,
        "taints": [dict(t) for t in n.ours],
        "condition": n.condition,
        "gpus": [
            {
                "index": g.info.index,
                "uuid": g.info.uuid,
                "model": g.info.model,
                "pci_bus_id": g.info.pci_bus_id,
                "state": g.state,
                "since": g.state_since,
                "conditions": g.conditions,
                "telemetry": g.telemetry,
            }
            for g in n.gpus
        ],
        "allocations": n.allocations,
        "nics": rec.nics if rec else [],
        "allocations_unknown": rec.allocations_unknown if rec is not None else None,
    }


def _last_seen(rec: NodeRecord | None, now_mono: float) -> float | None:
    return round(now_mono - rec.last_seen, 3) if rec is not None else None


def node_json(n: NodeStatus, now_mono: float) -> dict[str, Any]:
    body: dict[str, Any] = _plain(node_body(n))
    body["last_seen_seconds_ago"] = _last_seen(n.agent, now_mono)
    return body


def node_fragment(n: NodeStatus) -> bytes:
    """:func:`node_body` encoded, without its closing brace (what the fleet cache keeps)."""
    return _encode(node_body(n))[:-1]


def _node_bytes(e: CachedNode, now_mono: float) -> bytes:
    seen = _last_seen(e.record, now_mono)
    return e.fragment + b',"last_seen_seconds_ago":' + (_encode(seen) + b"}")


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
    """The whole document built at once (the reference the cached answer is tested and
    benchmarked against). ``remediation``:
    :func:`gpuhealth.controller.remediation.summary.remediation_json` (None: the loop is off)."""
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


WHOLE_FLEET = FleetQuery()
FLEET_CHUNK = 256
"""Nodes written per write of a ``/api/v1/fleet`` answer (each write is compressed off the
event loop, and waits for the client to take it)."""


@dataclass(frozen=True, slots=True)
class ApiV1:
    """The handlers, over the narrow reads and the one action they need."""

    cache: FleetCache
    breaker_status: Callable[[], BreakerStatus]
    reset_breaker_and_requeue: Callable[[], list[str]]
    """Close the breaker and requeue the nodes it blocked (the reconciler's reset)."""
    is_leader: Callable[[], bool]
    dry_run: bool
    clock: Clock
    episodes: Callable[[], list[Episode]] | None = None
    """The GPURemediation watch cache (None: remediation is off)."""
    incidents: IncidentReader | None = None
    """The fleet-level incidents (``gpuhealth.controller.incidents``: the leader's book, the
    GPUIncident objects on another replica)."""

    def incidents_document(self, *, include_closed: bool = False) -> list[dict[str, Any]]:
        if self.incidents is None:
            return []
        now = self.clock.now()
        return [i.to_dict(now) for i in self.incidents.list(include_closed=include_closed)]

    def breaker_document(self) -> dict[str, Any]:
        return breaker_json(self.breaker_status())

    def fleet_head(self, page: Page, query: FleetQuery) -> dict[str, Any]:
        """Everything of the fleet document but its nodes: ``summary`` counts the whole
        fleet; ``continue`` asks for the next page (None: this is the last)."""
        cache = self.cache
        return {
            "generated": self.clock.now().isoformat(),
            "leader": self.is_leader(),
            "dry_run": self.dry_run,
            "breaker": self.breaker_document(),
            "summary": {"nodes": dict(cache.node_counts), "gpus": dict(cache.gpu_counts)},
            "remediation": (
                remediation_json(self.episodes(), self.clock.now())
                if self.episodes is not None
                else None
            ),
            "incidents": self.incidents_document(),
            "continue": encode_continue(page.after) if page.after is not None else None,
            "filtered": not query.everything,
        }

    def fleet_chunks(self, query: FleetQuery, page: Page) -> Iterator[bytes]:
        """The fleet document of ``page`` (what ``query`` selected) as consecutive byte
        strings."""
        now_mono = self.clock.monotonic()
        yield _encode(self.fleet_head(page, query))[:-1] + b',"nodes":['
        nodes = page.nodes
        for start in range(0, len(nodes), FLEET_CHUNK):
            chunk = b",".join(_node_bytes(e, now_mono) for e in nodes[start : start + FLEET_CHUNK])
            yield chunk if start == 0 else b"," + chunk
        yield b"]}"

    def fleet_document(self, query: FleetQuery = WHOLE_FLEET) -> dict[str, Any]:
        """The document decoded (tests, tools in-process); refreshes the cache at once."""
        self.cache.refresh_all()
        page = self.cache.select(query)
        doc: dict[str, Any] = msgspec.json.decode(b"".join(self.fleet_chunks(query, page)))
        return doc

    async def _page(self, query: FleetQuery) -> Page:
        """``query``'s page, the cache brought up to date in slices between yields."""
        await self.cache.refresh()
        page = await self.cache.scan(query)
        return Page(await self.cache.fresh(page.nodes), page.after)

    async def fleet_page(self, params: Iterable[tuple[str, str]]) -> dict[str, Any]:
        """The document ``GET /api/v1/fleet`` answers for ``params``, decoded (what a
        merged read past one process takes of this replica's own shards,
        :mod:`gpuhealth.controller.shards.reads`); :class:`QueryError` for bad ones."""
        query = parse_query(params)
        page = await self._page(query)
        doc: dict[str, Any] = msgspec.json.decode(b"".join(self.fleet_chunks(query, page)))
        return doc

    async def get_fleet(self, req: web.Request) -> web.StreamResponse:
        try:
            query = parse_query(req.query.items())
        except QueryError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        page = await self._page(query)
        resp = web.StreamResponse(headers={"Cache-Control": "no-store"})
        resp.content_type = "application/json"
        resp.enable_compression()
        await resp.prepare(req)
        for chunk in self.fleet_chunks(query, page):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def get_incidents(self, req: web.Request) -> web.Response:
        state = req.query.get("state", "")
        if state not in ("", "open", "all"):
            return web.json_response({"error": "state must be open or all"}, status=400)
        items = self.incidents_document(include_closed=state != "open")
        counts = dict(self.incidents.counts()) if self.incidents is not None else {}
        return web.json_response(
            {"generated": self.clock.now().isoformat(), "open": counts, "incidents": items},
            headers={"Cache-Control": "no-store"},
        )

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
            web.get(INCIDENTS_PATH, self.get_incidents),
            web.post(BREAKER_RESET_PATH, self.reset_breaker),
        ]
