"""The circuit breaker's state past one process: one ConfigMap per shard.

With ``shards.count`` above 1 each shard's owner runs its own breaker over its shards' nodes,
and a shard's state is kept in the ConfigMap ``<breaker.configmap>-shard-<i>``
(:func:`shard_configmap`, each in :mod:`gpuhealth.controller.breaker.store`'s format), so
that whoever owns the shard next adopts it. :class:`ShardedBreakerStore` is a
:class:`~gpuhealth.controller.breaker.sync.BreakerStorage` over the maps of one set of owned
shards, for one ownership term (a replica whose owned shards change builds another and loads
again, as a new leader does):

- :meth:`~ShardedBreakerStore.load` is the union of the owned shards' stored states
  (:func:`union`): open if any is open (the fleet's breaker, and each pool's), the window the
  union of the windows (a node counted from its latest admission): a takeover of a shard whose
  breaker is open keeps it open, and its window counts against the new owner's budget;
- :meth:`~ShardedBreakerStore.save` writes each window entry into the map of its node's shard
  (``shard_of_node``: the owners' node cache's shard label), an entry whose node's shard is not
  known or not owned here into the lowest owned shard's (kept, never dropped: it only counts
  against that shard's next owner too), and the open flags, trips and open pools into every
  owned shard's map (:func:`by_shard`). A map that says what was last read or written there
  (:func:`same_state`) is not written again: an admission writes its node's shard's map only.

An operator closing the breaker by hand (``data.state: closed``) closes a shard's map; an
owner's breaker closes once every owned shard's map is closed (``gpuhealth-controller breaker
reset`` closes the owner's breaker and so writes every map). With one shard the breaker
keeps its one ConfigMap (:class:`~gpuhealth.controller.breaker.store.BreakerStore`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from gpuhealth.controller.breaker.store import (
    OpenPool,
    StoredBreaker,
    WindowEntry,
    configmap_data,
    stored_from_data,
)
from gpuhealth.controller.kube.configmap import read_data, write_data
from gpuhealth.controller.kube.rest import ApiClient

ShardOfNode = Callable[[str], int | None]
"""A node's shard (its shard label), None when not known."""


def shard_configmap(configmap: str, shard: int) -> str:
    """The ConfigMap of shard ``shard``'s breaker: ``<breaker.configmap>-shard-<i>``."""
    return f"{configmap}-shard-{shard}"


def _when(text: str) -> datetime | None:
    """An entry's time (one without a zone taken as UTC); None when unreadable."""
    try:
        at = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def _later(a: WindowEntry, b: WindowEntry) -> WindowEntry:
    """The entry of the later admission (an unreadable time is the earlier)."""
    ta, tb = _when(a.at), _when(b.at)
    if ta is None or (tb is not None and tb > ta):
        return b
    return a


def union(states: Sequence[StoredBreaker]) -> StoredBreaker | None:
    """The stored states of several shards as one: open if any is open (the trip the earliest
    of the open ones', the trips the most), each pool open in any of them open (its most
    trips), the window every node's latest admission. None for none."""
    if not states:
        return None
    window: dict[str, WindowEntry] = {}
    for state in states:
        for entry in state.window:
            kept = window.get(entry.node)
            window[entry.node] = entry if kept is None else _later(kept, entry)
    pools: dict[str, OpenPool] = {}
    for state in states:
        for pool in state.pools:
            kept_pool = pools.get(pool.pool)
            if kept_pool is None or pool.trips > kept_pool.trips:
                pools[pool.pool] = pool
    opened = [s for s in states if s.open]
    first = min(
        opened, key=lambda s: _when(s.tripped_at) or datetime.max.replace(tzinfo=UTC), default=None
    )
    return StoredBreaker(
        open=first is not None,
        trips=max(s.trips for s in states),
        tripped_at=first.tripped_at if first else "",
        message=next((s.message for s in states if s.any_open and s.message), ""),
        window=tuple(sorted(window.values(), key=lambda e: (e.at, e.node))),
        pools=tuple(pools[p] for p in sorted(pools)),
    )


SAME_AT_S = 1.0
"""Two admission times of one node this close are one admission (a window's times are kept
on the monotonic clock and drift by microseconds each time they are written out)."""


def same_state(a: StoredBreaker, b: StoredBreaker) -> bool:
    """Do ``a`` and ``b`` say the same: every field equal, the window's nodes and pools in
    the same order at times within :data:`SAME_AT_S` of each other."""
    if (a.open, a.trips, a.tripped_at, a.message, a.pools) != (
        b.open,
        b.trips,
        b.tripped_at,
        b.message,
        b.pools,
    ) or len(a.window) != len(b.window):
        return False
    for x, y in zip(a.window, b.window, strict=True):
        tx, ty = _when(x.at), _when(y.at)
        if (x.node, x.pool) != (y.node, y.pool) or tx is None or ty is None:
            return False
        if abs((tx - ty).total_seconds()) >= SAME_AT_S:
            return False
    return True


def by_shard(
    state: StoredBreaker, owned: Iterable[int], shard_of_node: ShardOfNode
) -> dict[int, StoredBreaker]:
    """What each owned shard's map holds of ``state``: the window entries of its nodes (those
    of a node whose shard is unknown or not owned: the lowest owned shard's), and the rest of
    the state whole. Empty when nothing is owned."""
    shards = sorted(set(owned))
    if not shards:
        return {}
    entries: dict[int, list[WindowEntry]] = {i: [] for i in shards}
    for entry in state.window:
        shard = shard_of_node(entry.node)
        entries[shard if shard in entries else shards[0]].append(entry)
    return {
        i: StoredBreaker(
            open=state.open,
            trips=state.trips,
            tripped_at=state.tripped_at,
            message=state.message,
            window=tuple(entries[i]),
            pools=state.pools,
        )
        for i in shards
    }


class ShardedBreakerStore:
    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        configmap: str,
        owned: Iterable[int],
        shard_of_node: ShardOfNode,
        *,
        timeout_s: float = 10.0,
    ) -> None:
        """``configmap``: ``breaker.configmap`` (each shard's map is named from it);
        ``owned``: the shards this term owns."""
        self._api = api
        self._namespace = namespace
        self._configmap = configmap
        self.owned = tuple(sorted(set(owned)))
        self._shard_of_node = shard_of_node
        self._timeout = timeout_s
        self._known: dict[int, StoredBreaker] = {}
        """What each shard's map said when last read or written here (not written again)."""

    async def load(self) -> StoredBreaker | None:
        """The union of the owned shards' stored states; None when none has any. A read
        that fails raises (:class:`~gpuhealth.controller.kube.rest.KubeError`)."""
        states = []
        for i in self.owned:
            data = await read_data(
                self._api,
                self._namespace,
                shard_configmap(self._configmap, i),
                timeout_s=self._timeout,
            )
            if data is None:
                self._known.pop(i, None)
                continue
            self._known[i] = stored_from_data(data)
            states.append(self._known[i])
        return union(states)

    async def save(self, state: StoredBreaker) -> None:
        """Each owned shard's part of ``state`` into its map (:func:`by_shard`)."""
        for i, part in by_shard(state, self.owned, self._shard_of_node).items():
            known = self._known.get(i)
            if known is not None and same_state(known, part):
                continue
            self._known.pop(i, None)  # unknown until the write is answered
            await write_data(
                self._api,
                self._namespace,
                shard_configmap(self._configmap, i),
                configmap_data(part),
                timeout_s=self._timeout,
            )
            self._known[i] = part
