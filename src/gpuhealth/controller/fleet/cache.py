"""The fleet view kept ready for readers at any fleet size: one entry per node (its
:class:`~gpuhealth.controller.fleet.query.FleetNodeSummary` and its encoded ``/api/v1/fleet``
fragment), re-encoded only for the nodes that changed, so that answering a request is filtering
summaries and concatenating bytes, never building the whole fleet on the event loop.

A node is dirty once the fleet tells its listeners about it (every change of its agent's
state, connection or allocations) or the node watch cache does (taints, labels, condition);
a heartbeat (telemetry and usage) only makes its fragment stale: its summary, what counts,
groups and filters read, is unchanged. A reader first awaits :meth:`FleetCache.refresh`,
which rebuilds the nodes dirty at that moment, ``chunk`` at a time, yielding to the event
loop between chunks; a reader of fragments then re-encodes the stale ones among the nodes it
answers (:meth:`FleetCache.fresh`), so the overview never pays for heartbeats and a page
only for its own nodes. Telemetry a Snapshot brings without any other change shows with the
node's next heartbeat.
Nodes are listed in natural name order (:func:`gpuhealth.controller.fleet.view.natural_key`), the
one order of every fleet view, and are the nodes
:func:`gpuhealth.controller.fleet.view.build_fleet_view` lists. Counts by state and by group are
kept as entries change.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from gpuhealth.controller.fleet.health import GPU_MISSING_CODE
from gpuhealth.controller.fleet.model import ChangeKind, FleetReader, NodeRecord
from gpuhealth.controller.fleet.pools import pool_of
from gpuhealth.controller.fleet.query import (
    AGENT_SILENT,
    NO_AGENT,
    NO_REPORT,
    FleetNodeSummary,
    FleetQuery,
)
from gpuhealth.controller.fleet.view import NodeStatus, natural_key, node_status
from gpuhealth.controller.kube.node_cache import Change
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import DEFAULT_POOL_LABELS, Keys
from gpuhealth.protocol import HEALTH_STATES

SCAN_SLICE = 2000
"""Nodes a listing looks at between two yields to the event loop (:meth:`FleetCache.scan`)."""
REFRESH_CHUNK = 64
"""Nodes re-encoded between two yields to the event loop (about 100-150 µs each on the
2-core reference machine)."""

Fragment = Callable[[NodeStatus], bytes]
"""A node's JSON object without its closing brace
(``gpuhealth.controller.http.api.node_fragment``)."""
Group = tuple[str, str, str]
"""(state, pool, reason)."""

_STATE_INDEX = {s: i for i, s in enumerate(HEALTH_STATES)}


class NodeLookup(Protocol):
    """What the cache reads of the node watch cache
    (``gpuhealth.controller.kube.node_cache.NodeCache``)."""

    def get(self, name: str) -> NodeView | None: ...

    def views(self) -> list[NodeView]: ...

    def subscribe(
        self, listener: Callable[[Change, NodeView | None, NodeView | None], None]
    ) -> None: ...


def summarise(n: NodeStatus, pool_labels: Sequence[str] = DEFAULT_POOL_LABELS) -> FleetNodeSummary:
    """The node as filters, counts and groups see it (its pool: the first of ``pool_labels``
    it carries)."""
    codes: list[str] = []
    primary = ""
    rec = n.agent
    if rec is None:
        codes.append(NO_AGENT)
    elif rec.silent:
        codes.append(AGENT_SILENT)
    elif not rec.has_snapshot:
        codes.append(NO_REPORT)
    else:
        if rec.gpus_missing():
            codes.append(GPU_MISSING_CODE)
            primary = GPU_MISSING_CODE
        conds = [*rec.node_conditions, *(c for g in n.gpus for c in g.conditions)]
        for c in conds:
            if c.severity != "healthy":
                codes.append(c.code)
                if not primary and c.severity == n.state:
                    primary = c.code
    if n.state != "healthy" and not primary and codes:
        primary = codes[0]
    gpus = [0] * len(HEALTH_STATES)
    for g in n.gpus:
        gpus[_STATE_INDEX[n.gpu_state(g)]] += 1
    labels = n.node.labels if n.node is not None else {}
    return FleetNodeSummary(
        name=n.name,
        state=n.state,
        pool=pool_of(labels, pool_labels),
        reason=primary if n.state != "healthy" else "",
        reasons=frozenset(codes),
        labels=labels,
        tainted=bool(n.ours),
        connected=n.connected,
        gpus=tuple(gpus),
    )


@dataclass(frozen=True, slots=True)
class CachedNode:
    summary: FleetNodeSummary
    fragment: bytes
    """The node's ``/api/v1/fleet`` object without ``last_seen_seconds_ago`` and the
    closing brace."""
    record: NodeRecord | None
    """Its agent's live record (``last_seen`` is read per request)."""


@dataclass(frozen=True, slots=True)
class Page:
    nodes: list[CachedNode]
    after: str | None
    """The last node of this page when more match (the next page's start), else None."""


class FleetCache:
    def __init__(
        self,
        fleet: FleetReader,
        nodes: NodeLookup,
        keys: Keys,
        fragment: Fragment,
        *,
        chunk: int = REFRESH_CHUNK,
        pool_labels: Sequence[str] = DEFAULT_POOL_LABELS,
    ) -> None:
        self._fleet = fleet
        self._pool_labels = tuple(pool_labels)
        self._nodes = nodes
        self._keys = keys
        self._fragment = fragment
        self.chunk = chunk
        self._entries: dict[str, CachedNode] = {}
        self._order: list[tuple[list[Any], str]] = []
        self._dirty: set[str] = {r.name for r in fleet.nodes()}
        """Nodes whose summary (and fragment) must be rebuilt."""
        self._dirty.update(v.name for v in nodes.views())
        self._stale: set[str] = set()
        """Nodes whose fragment alone is out of date (a heartbeat's telemetry)."""
        self.node_counts: dict[str, int] = dict.fromkeys(HEALTH_STATES, 0)
        self.gpu_counts: dict[str, int] = dict.fromkeys(HEALTH_STATES, 0)
        self.groups: Counter[Group] = Counter()
        """Nodes by (state, pool, reason)."""
        self.tainted = 0
        self.connected = 0
        self.encoded = 0
        """Nodes encoded since start (tests and the benchmark read it)."""
        fleet.subscribe(self._on_fleet)
        nodes.subscribe(self._on_node)

    # -- invalidation ----------------------------------------------------------------------

    def _on_fleet(self, node: str, kind: ChangeKind) -> None:
        if kind == "usage":
            self._stale.add(node)
        else:
            self._dirty.add(node)

    def _on_node(self, _change: Change, old: NodeView | None, new: NodeView | None) -> None:
        view = new or old
        if view is not None:
            self._dirty.add(view.name)

    @property
    def dirty(self) -> int:
        return len(self._dirty)

    def refresh_some(self, limit: int) -> int:
        """Re-encode up to ``limit`` dirty nodes now; returns how many."""
        done = 0
        while done < limit and self._dirty:
            self._rebuild(self._dirty.pop())
            done += 1
        return done

    def refresh_all(self) -> None:
        """Every summary and every fragment up to date now (tests, in-process readers)."""
        self.refresh_some(len(self._dirty))
        for name in list(self._stale):
            self._refragment(name)

    async def fresh(self, nodes: list[CachedNode]) -> list[CachedNode]:
        """``nodes`` with their fragments brought up to date (re-encoding those a heartbeat
        made stale, ``chunk`` at a time between yields)."""
        out: list[CachedNode] = []
        done = 0
        for entry in nodes:
            name = entry.summary.name
            if name not in self._stale:
                out.append(entry)
                continue
            if done and done % self.chunk == 0:
                await asyncio.sleep(0)
            out.append(self._refragment(name) or entry)
            done += 1
        return out

    def _refragment(self, name: str) -> CachedNode | None:
        self._stale.discard(name)
        old = self._entries.get(name)
        if old is None:
            return None
        if name in self._dirty:
            self._dirty.discard(name)
            self._rebuild(name)
            return self._entries.get(name)
        status = node_status(name, self._fleet.node(name), self._nodes.get(name), self._keys)
        entry = CachedNode(old.summary, self._fragment(status), old.record)
        self.encoded += 1
        self._entries[name] = entry
        return entry

    async def refresh(self) -> None:
        """Re-encode the nodes dirty now, ``chunk`` at a time between yields (nodes changed
        meanwhile wait for the next reader)."""
        budget = len(self._dirty)
        while budget > 0:
            done = self.refresh_some(min(self.chunk, budget))
            budget -= done
            if done == 0:
                return
            if budget > 0:
                await asyncio.sleep(0)

    def _rebuild(self, name: str) -> None:
        self._stale.discard(name)
        rec = self._fleet.node(name)
        view = self._nodes.get(name)
        old = self._entries.get(name)
        if rec is None and (view is None or view.gpus <= 0):
            if old is not None:
                self._count(old.summary, -1)
                del self._entries[name]
                key = (natural_key(name), name)
                i = bisect_right(self._order, key) - 1
                if i >= 0 and self._order[i][1] == name:
                    del self._order[i]
            return
        status = node_status(name, rec, view, self._keys)
        entry = CachedNode(summarise(status, self._pool_labels), self._fragment(status), rec)
        self.encoded += 1
        if old is None:
            insort(self._order, (natural_key(name), name))
        else:
            self._count(old.summary, -1)
        self._entries[name] = entry
        self._count(entry.summary, 1)

    def _count(self, s: FleetNodeSummary, sign: int) -> None:
        self.node_counts[s.state] += sign
        for state, n in zip(HEALTH_STATES, s.gpus, strict=True):
            self.gpu_counts[state] += sign * n
        group = (s.state, s.pool, s.reason)
        self.groups[group] += sign
        if self.groups[group] <= 0:
            del self.groups[group]
        self.tainted += sign * s.tainted
        self.connected += sign * s.connected

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def gpu_total(self) -> int:
        return sum(self.gpu_counts.values())

    def entries(self) -> Iterator[CachedNode]:
        """Every node in order."""
        return (self._entries[name] for _, name in self._order)

    async def scan(self, query: FleetQuery) -> Page:
        """:meth:`select`, yielding to the event loop every ``SCAN_SLICE`` nodes; nodes added
        or removed meanwhile are listed or left out as they are when their turn comes (the
        order is by name, so the listing resumes after the last name looked at)."""
        match = query.filter.matches
        everything = query.filter.everything
        out: list[CachedNode] = []
        cursor = query.after
        while True:
            start = 0
            if cursor is not None:
                start = bisect_right(self._order, (natural_key(cursor), cursor))
            names = [name for _, name in self._order[start : start + SCAN_SLICE]]
            for name in names:
                entry = self._entries.get(name)
                if entry is None or not (everything or match(entry.summary)):
                    continue
                if query.limit is not None and len(out) == query.limit:
                    return Page(out, out[-1].summary.name)
                out.append(entry)
            if len(names) < SCAN_SLICE:
                return Page(out, None)
            cursor = names[-1]
            await asyncio.sleep(0)

    def select(self, query: FleetQuery) -> Page:
        """The page ``query`` asks for, at once (:meth:`scan` on the event loop)."""
        start = 0
        if query.after is not None:
            start = bisect_right(self._order, (natural_key(query.after), query.after))
        match = query.filter.matches
        everything = query.filter.everything
        out: list[CachedNode] = []
        for _, name in islice(self._order, start, None):
            entry = self._entries[name]
            if not everything and not match(entry.summary):
                continue
            if query.limit is not None and len(out) == query.limit:
                return Page(out, out[-1].summary.name)
            out.append(entry)
        return Page(out, None)
