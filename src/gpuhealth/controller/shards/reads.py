"""Fleet-wide reads past one process: ``/api/v1/overview`` and ``/api/v1/fleet`` answered by
any replica for the whole fleet.

:class:`MergedReads` is a middleware in front of the two routes (mounted only when
``shards.count`` > 1; with one shard the routes answer as they always did). A GET with
``scope=local`` is answered from this replica's own view, with the shards it holds
(``shards``): what the other replicas ask. Any other GET is merged:

- the overview: this replica's own view for its shards (no HTTP), and one ``scope=local``
  overview from each other owner, summed
  (:func:`gpuhealth.controller.shards.merge.merge_overviews`), kept ``cache_s`` per query
  (the status page polls it);
- a fleet page: the shards walked in order, each shard's nodes selected by its label
  (``Keys.shard_label``) from its owner's view (this replica's for its own), ``limit``
  filled across shards, the ``continue`` token naming the shard and the position inside it
  (:func:`gpuhealth.controller.shards.merge.encode_walk`). A read without ``limit`` is paged
  at :data:`~gpuhealth.controller.fleet.query.MAX_LIMIT` nodes all the same (its
  ``continue`` asks for the rest): a whole fleet past one process is too large to hold at
  once in the replica that merges it.

A shard whose owner is unknown or does not answer is named under ``shards.unavailable``;
a bad query or a forged ``continue`` token is a 400 with the reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from gpuhealth.common.clock import Clock
from gpuhealth.controller.fleet.query import MAX_LIMIT, QueryError, parse_query
from gpuhealth.controller.shards.merge import FleetPage, Walk, decode_walk, merge_overviews
from gpuhealth.controller.shards.peers import LOCAL_SCOPE, ShardAnswer


class Peers(Protocol):
    """The other shards' owners (:class:`~gpuhealth.controller.shards.peers.ShardPeers`)."""

    @property
    def count(self) -> int: ...

    async def ask(
        self, shard: int, path: str, params: Sequence[tuple[str, str]]
    ) -> ShardAnswer: ...

    async def ask_owners(
        self, shards: Sequence[int], path: str, params: Sequence[tuple[str, str]]
    ) -> list[ShardAnswer]: ...


LocalRead = Callable[[Sequence[tuple[str, str]]], Awaitable[dict[str, Any]]]
"""This replica's own document for the query parameters (raises
:class:`~gpuhealth.controller.fleet.query.QueryError` for bad ones)."""

WALK_PARAMS = frozenset({"continue", "limit", LOCAL_SCOPE[0]})
"""Query parameters the walk sets itself for each shard."""


class MergedReads:
    def __init__(
        self,
        peers: Peers,
        owned: Callable[[], frozenset[int]],
        *,
        shard_label: str,
        fleet_path: str,
        overview_path: str,
        local_fleet: LocalRead,
        local_overview: LocalRead,
        overview_nodes: int,
        clock: Clock,
        cache_s: float,
    ) -> None:
        """``owned``: the shards this replica holds now (``ShardLeases.owned``);
        ``shard_label``: ``Keys.shard_label``; ``overview_nodes``: the nodes one overview
        lists (``OVERVIEW_NODES``); ``cache_s``: how long a merged overview is reused."""
        self.peers = peers
        self.count = peers.count
        self._owned = owned
        self.shard_label = shard_label
        self.fleet_path = fleet_path
        self.overview_path = overview_path
        self._local_fleet = local_fleet
        self._local_overview = local_overview
        self.overview_nodes = overview_nodes
        self._clock = clock
        self.cache_s = cache_s
        self._overviews: dict[str, tuple[float, dict[str, Any]]] = {}
        self.page_nodes = MAX_LIMIT
        """Nodes in a page asked for without ``limit``."""

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if request.method != "GET" or path not in (self.fleet_path, self.overview_path):
            return await handler(request)
        params = list(request.query.items())
        try:
            if request.query.get(LOCAL_SCOPE[0]) == LOCAL_SCOPE[1]:
                doc = await self.local(path, params)
            elif path == self.overview_path:
                doc = await self.overview(params, request.query_string)
            else:
                doc = await self.fleet(params)
        except QueryError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        resp = web.Response(
            body=msgspec.json.encode(doc),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
        resp.enable_compression()
        return resp

    async def local(self, path: str, params: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """This replica's own answer, naming the shards it held throughout."""
        before = self._owned()
        read = self._local_overview if path == self.overview_path else self._local_fleet
        doc = await read([p for p in params if p[0] != LOCAL_SCOPE[0]])
        doc["shards"] = sorted(before & self._owned())
        return doc

    async def overview(self, params: Sequence[tuple[str, str]], key: str = "") -> dict[str, Any]:
        parse_query(params)  # a bad query is refused here, not once per owner
        now = self._clock.monotonic()
        hit = self._overviews.get(key)
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        owned = self._owned()
        answers: list[ShardAnswer] = []
        if owned:
            answers.append(
                ShardAnswer(tuple(sorted(owned)), await self.local(self.overview_path, params))
            )
        others = [i for i in range(self.count) if i not in owned]
        answers += await self.peers.ask_owners(others, self.overview_path, params)
        doc = merge_overviews(answers, self.count, self.overview_nodes)
        self._overviews = {k: v for k, v in self._overviews.items() if now - v[0] < self.cache_s}
        self._overviews[key] = (now, doc)
        return doc

    async def shard_page(self, shard: int, params: Sequence[tuple[str, str]]) -> ShardAnswer:
        """Shard ``shard``'s nodes selected by its label: locally when this replica holds
        it, else from its owner."""
        params = [*params, ("label", f"{self.shard_label}={shard}")]
        if shard in self._owned():
            return ShardAnswer((shard,), await self.local(self.fleet_path, params))
        return await self.peers.ask(shard, self.fleet_path, params)

    async def fleet(self, params: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """One page of the whole fleet: from the token's shard and position on, ``limit``
        nodes (:attr:`page_nodes` without it) filled across shards."""
        base = [p for p in params if p[0] not in WALK_PARAMS]
        # Filters and limit checked once, before any shard; the token is the walk's.
        query = parse_query([*base, *((k, v) for k, v in params if k == "limit")])
        tokens = [v for k, v in params if k == "continue" and v]
        walk = decode_walk(tokens[-1], self.count) if tokens else Walk(0)
        remaining = query.limit if query.limit is not None else self.page_nodes
        page = FleetPage(self.count)
        shard, inner = walk.shard, walk.inner
        after: Walk | None = None
        while shard < self.count:
            asked = [*base, ("limit", str(remaining)), *([("continue", inner)] if inner else [])]
            answer = await self.shard_page(shard, asked)
            if page.add(answer) and answer.body is not None:
                remaining -= len(answer.body.get("nodes") or [])
                nxt = answer.body.get("continue")
                if isinstance(nxt, str) and nxt:
                    after = Walk(shard, nxt)
                    break
            shard, inner = shard + 1, None
            if remaining <= 0:
                after = Walk(shard) if shard < self.count else None
                break
        return page.document(after)
