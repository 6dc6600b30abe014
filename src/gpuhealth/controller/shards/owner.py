"""This replica's part of the fleet past one process: the shards it owns, the Nodes it
watches, and the owner's work, started again whenever that set changes.

:class:`ShardOwner` follows :class:`~gpuhealth.controller.shards.leases.ShardLeases`. While
the set of shards it owns stays the same, the owner's work (today's leader work for those
shards' nodes: the reconciler, the incidents' objects, DRA, remediation, the per-shard
endpoints; a :class:`~gpuhealth.controller.leadership.work.LeaderWork` built for that set)
runs, and the node cache watches only those shards' Nodes (``<shard label> in (...)``). When
the set changes (a shard won at start or taken over, one lost):

1. the work is stopped first (``ready`` goes false: the gate allows no hard write);
2. the node cache is scoped to the new set (a Node outside it has ``left``: it still exists,
   nothing that follows a deletion follows), and ``on_scope`` drops what this replica held
   of the nodes it no longer serves (their agents' connections, going away: they come back
   to their shard's owner; their fleet records);
3. with any shard owned, the node watch lists the new set, and a new work for it prepares
   (the cache synced, the breaker's stored state and the incidents adopted for these shards)
   before its first write, exactly as a new leader does.

A Node relabelled into another shard leaves the cache alone (the watch's selector no longer
matches it); ``on_scope`` runs for it too, so its agent's stream is closed and goes to the
new owner. A shard lost stops this replica writing its nodes at once: :meth:`serves` reads
the Leases themselves (an elector's ``is_leader`` goes false before anything else), not the set the
work was built for. Restarting the whole work for a change keeps one rule for every part
(what a takeover adopts is what a new leader adopts); the cost is a few seconds without
writes on the shards this replica kept, at a takeover only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.leadership.work import LeaderWork
from gpuhealth.controller.shards.leases import ShardLeases

log = get_logger("shards")


def shard_selector(label: str, shards: Collection[int]) -> str | None:
    """The label selector of the Nodes of ``shards`` (None: no shard, no Node)."""
    if not shards:
        return None
    return f"{label} in ({','.join(str(i) for i in sorted(shards))})"


def labelled_shard(labels: Mapping[str, str], label: str, count: int) -> int | None:
    """The shard a Node's label names, None when it has none or a value that is no shard of
    ``count`` (a hand edit: no owner serves it until the singleton puts it right)."""
    value = labels.get(label)
    if value is None or not value.isdigit():
        return None
    shard = int(value)
    return shard if shard < count else None


FLEET_WIDE_KINDS = frozenset({"capability"})
"""Incident kinds decided from what every replica sees alike (the capability incident: the
remediation episodes, watched on every replica), not from one shard's nodes: written by the
owner of shard 0 only, so that one object has one writer."""


def keeps_incident(
    kind: str,
    nodes: Collection[str],
    *,
    serves: Callable[[str], bool],
    owned: Callable[[], frozenset[int]],
) -> bool:
    """Whether this replica keeps an incident's object in step with its decision: one about
    nodes, when it owns one of them now; a fleet-wide one, when it owns shard 0."""
    if kind in FLEET_WIDE_KINDS:
        return 0 in owned()
    return any(serves(n) for n in nodes)


class ShardOwner:
    def __init__(
        self,
        leases: ShardLeases,
        cache: NodeCache,
        *,
        label: str,
        work: Callable[[frozenset[int]], LeaderWork],
        on_scope: Callable[[], Awaitable[None]],
        gone: Callable[[str], Awaitable[bool]] | None = None,
        endpoint: Callable[[int], Callable[[], Coroutine[object, object, None]] | None]
        | None = None,
        clock: Clock | None = None,
        settle_s: float = 0.0,
    ) -> None:
        """``endpoint``: shard ``i``'s endpoint publication (its ``run``; None: not
        published); ``settle_s``: ``shards.rescope_settle_s``."""
        self.leases = leases
        self._cache = cache
        self._label = label
        self._count = leases.shards.count
        self._make_work = work
        self._on_scope = on_scope
        self._gone = gone
        self._endpoint = endpoint
        self._clock = clock or SystemClock()
        self._settle_s = settle_s
        self._endpoints: dict[int, asyncio.Task[None] | None] = {}
        """The shards whose endpoint this replica publishes: from the first time its work for
        them prepared until the shard is lost (a work started again for another set keeps
        them published: their agents stay, new ones are not refused meanwhile)."""
        self.scoped: frozenset[int] = frozenset()
        """The shards the node cache and the current work are for."""
        self.work: LeaderWork | None = None
        self.changes = 0
        """How often the set changed (a test's and a log's reading)."""
        self._left = asyncio.Event()
        """A Node left the cache (relabelled into another shard, or deleted): what this
        replica held of it goes, as at a change of the set."""
        self._left_views: dict[str, NodeView] = {}
        """Those Nodes, until asked whether they were deleted (``gone``)."""
        cache.subscribe(self._on_node)

    # -- what this replica serves now ------------------------------------------------------

    def shard_of_labels(self, labels: Mapping[str, str]) -> int | None:
        return labelled_shard(labels, self._label, self._count)

    def owns_shard(self, shard: int | None) -> bool:
        """``shard`` is in the set the work is for and its Lease is held now."""
        return shard is not None and shard in self.scoped and shard in self.leases.owned()

    def in_scope(self, labels: Mapping[str, str]) -> bool:
        """A Node of these labels belongs to the set the node cache watches."""
        shard = self.shard_of_labels(labels)
        return shard is not None and shard in self.scoped

    def serves(self, node: str) -> bool:
        """This replica owns ``node`` now: it watches it and holds its shard's Lease."""
        view = self._cache.get(node)
        return view is not None and self.owns_shard(self.shard_of_labels(view.labels))

    @property
    def ready(self) -> bool:
        """Some shard owned, and the work for the owned set has prepared: may write."""
        return self.work is not None and self.work.ready and bool(self.leases.owned())

    @property
    def synced(self) -> bool:
        """Nothing to watch, or the owned shards' Nodes listed (the replica's readiness)."""
        return not self.scoped or self._cache.synced.is_set()

    # -- the named task ``shard-owner`` ------------------------------------------------------

    async def run(self) -> None:
        watch: asyncio.Task[None] | None = None
        work: asyncio.Task[None] | None = None
        try:
            while True:
                self.leases.changed.clear()
                owned = self.leases.owned()
                if owned != self.scoped and self.scoped and self._settle_s:
                    # Leases are won one at a time: one rescope for the lot.
                    await self._clock.sleep(self._settle_s)
                    self.leases.changed.clear()
                    owned = self.leases.owned()
                if owned != self.scoped or (owned and watch is None):
                    await _stop(work)
                    await _stop(watch)
                    watch = work = None
                    await self._withdraw(self.scoped - owned)
                    await self._rescope(owned)
                    if owned:
                        watch = asyncio.create_task(self._cache.run(), name="node-watch")
                        self.work = self._make_work(owned)
                        work = asyncio.create_task(self.work.run(), name="shard-work")
                waits: dict[asyncio.Task[object], str] = {
                    asyncio.create_task(self.leases.changed.wait()): "changed",
                    asyncio.create_task(self._left.wait()): "left",
                }
                if self.work is not None and not self._published():
                    waits[asyncio.create_task(self.work.prepared.wait())] = "prepared"
                running = [t for t in (watch, work, *self._endpoints.values()) if t is not None]
                done, _ = await asyncio.wait(
                    [*waits, *running], return_when=asyncio.FIRST_COMPLETED
                )
                for task in waits:
                    task.cancel()
                for task in done - waits.keys():
                    task.result()  # a crash: the supervisor restarts the owner
                    raise RuntimeError(f"{task.get_name()} stopped")
                why = {waits[t] for t in done}
                if "prepared" in why:
                    self._publish()
                if "left" in why:
                    self._left.clear()
                    await self._on_scope()
                    await self._tell_deleted()
        finally:
            await _stop(work)
            await _stop(watch)
            await self._withdraw(set(self._endpoints))

    def _published(self) -> bool:
        return self._endpoint is None or self.scoped <= self._endpoints.keys()

    def _publish(self) -> None:
        """The owned shards' endpoints, once the work for them prepared (a shard with none to
        publish counts as published: nothing is waited for again)."""
        if self._endpoint is None:
            return
        for shard in sorted(self.scoped - self._endpoints.keys()):
            run = self._endpoint(shard)
            self._endpoints[shard] = (
                asyncio.create_task(run(), name=f"endpoint-{shard}") if run is not None else None
            )

    async def _withdraw(self, shards: Collection[int]) -> None:
        """Stop publishing these shards' endpoints (each withdraws its slice)."""
        for shard in sorted(shards):
            await _stop(self._endpoints.pop(shard, None))

    def _on_node(self, change: str, old: NodeView | None, _new: NodeView | None) -> None:
        if change == "left" and old is not None:
            self._left_views[old.name] = old
            self._left.set()

    async def _tell_deleted(self) -> None:
        """The Nodes that left outside a change of the set: each one the API server no
        longer has was deleted (the cache tells its listeners); the others moved to another
        shard. One that cannot be read is taken for moved: nothing follows a deletion."""
        views, self._left_views = self._left_views, {}
        if self._gone is None:
            return
        for name, view in views.items():
            if await self._gone(name):
                self._cache.tell_deleted(view)

    async def _rescope(self, owned: frozenset[int]) -> None:
        before = self.scoped
        self.scoped = owned
        self.work = None
        self.changes += 1
        self._cache.rescope(shard_selector(self._label, owned), self.in_scope)
        self._left.clear()
        self._left_views.clear()  # a shard lost: its Nodes still exist
        log.info(
            "shards_owned",
            shards=sorted(owned),
            gained=sorted(owned - before),
            lost=sorted(before - owned),
        )
        await self._on_scope()


async def _stop(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
