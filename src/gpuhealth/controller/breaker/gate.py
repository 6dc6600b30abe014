"""The circuit breaker and the one gate every hard write asks.

The one decision point for hard writes: every write that keeps work off a node or disrupts
it asks :class:`WriteGate` first.

A hard write is a Node's new NoSchedule/NoExecute taint (``node-taint``), a node's first
NoExecute taint (``node-noexecute``: it evicts pods even when the node is already cordoned),
a new DRA DeviceTaintRule (``device-taint``), and the remediation loop's disruptive steps
(``quarantine``, ``evict``, ``force-delete``, ``reset-gpu``, ``reboot``, ``replace-node``: the
deletion of a node's Karpenter NodeClaim, or of the Node). Removing a taint or a rule is never
a hard write and is never blocked.

The gate answers from two facts: this replica leads (a replica that lost its Lease, or never
had it, or has not yet loaded the breaker's stored state after winning it, writes nothing
hard), and the circuit breaker has room for the node (one budget for every kind: a node
counts once per window however many kinds of hard write it gets). A
refusal that opens the breaker is a *trip*: the gate logs it, counts it and tells its
subscribers (the reconciler posts the ``CircuitBreakerOpen`` Event on the node). A reset
(:meth:`WriteGate.reset`, from the operator's authenticated ``POST /api/v1/breaker/reset`` or
the breaker's ConfigMap) closes the breaker and tells the subscribers to take up what was
blocked.

The remediation loop depends only on :class:`HardWriteGate` (``request``).

The breaker behind the gate: at most a fraction of GPU nodes newly hard-tainted within a
window.

Pure state plus an injected clock. A false-positive storm (a bad driver push, a parser bug,
one job crashing on many nodes) must not cordon the fleet: once the number of distinct
nodes that gained a NoSchedule/NoExecute taint from gpuhealth within ``window_s`` would pass
``max(min_nodes, floor(max_fraction x GPU nodes))`` (at most what the stored window holds,
``gpuhealth.controller.breaker.store.MAX_WINDOW``), the breaker opens and stays open until an
operator resets it (docs/operations.md). A node admitted within the window keeps its
admission until the window passes, also once the breaker is open: its node taint, NoExecute
and device taints are one verdict, counted once (``gpuhealth.controller.breaker.gate``). Removing
taints is never blocked; PreferNoSchedule taints are not counted or blocked (they never keep a pod
off a node). The window (:meth:`CircuitBreaker.window`) is stored with the open/closed state
(``gpuhealth.controller.breaker.sync``), so a restarted controller or a new leader keeps counting
it.

Budgets per node pool (``per_pool``, ``gpuhealth.controller.fleet.pools``): every named pool
also has a budget of its own, ``max(min_nodes, floor(max_fraction x the pool's GPU nodes))``
(``breaker.pools`` may set another per pool). A node is admitted only when the fleet-wide budget
and its pool's both have room, so one storming pool cannot spend more of the fleet's budget than
its own, and a large pool cannot hide a small pool's storm. A pool that runs out opens its own
breaker (its nodes wait for an operator's reset; the other pools go on); the fleet that runs out
opens the fleet-wide one. Nodes in no pool have only the fleet-wide budget.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker.store import MAX_OPEN_POOLS, MAX_WINDOW


class GateVerdict(Enum):
    ALLOW = "allow"
    BLOCK = "block"
    TRIP = "trip"
    """Blocked, and this request opened the breaker (emit the Event, log loudly)."""


@dataclass(frozen=True, slots=True)
class PoolTrip:
    """A node pool whose own breaker is open."""

    tripped_at: datetime | None
    trips: int = 1


@dataclass(frozen=True, slots=True)
class PoolBreakerStatus:
    pool: str
    open: bool
    recent_nodes: int
    """Nodes of the pool admitted within the window."""
    limit: int
    """The pool's budget as last computed (0: not asked yet)."""
    tripped_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    open: bool
    trips: int
    tripped_at: datetime | None
    recent_nodes: int
    limit: int
    blocked_nodes: tuple[str, ...]
    enabled: bool
    """``breaker.enabled``: the settings the breaker applies, for whoever shows it."""
    max_fraction: float
    window_s: float
    pools: tuple[PoolBreakerStatus, ...] = ()
    """Pools that are open or have nodes in the window, by name."""

    @property
    def open_pools(self) -> tuple[str, ...]:
        return tuple(p.pool for p in self.pools if p.open)


NO_POOL = ""
"""Nodes in no pool: only the fleet-wide budget (``gpuhealth.controller.fleet.pools``)."""


class CircuitBreaker:
    def __init__(
        self,
        settings: BreakerSettings | None = None,
        clock: Clock | None = None,
        *,
        min_nodes: Callable[[], int] | None = None,
    ) -> None:
        """``min_nodes``: the fleet-wide floor this breaker may use, asked at each decision
        (past one process, a shard owner's part of ``breaker.min_nodes``:
        ``gpuhealth.controller.shards.sizes.ShardSizes.part``); None: ``settings.min_nodes``."""
        self.settings = settings or BreakerSettings()
        self._clock = clock or SystemClock()
        self._min_nodes = min_nodes
        self._recent: OrderedDict[str, float] = OrderedDict()
        """Node -> monotonic time it was allowed a new hard taint, oldest first."""
        self._pool_of: dict[str, str] = {}
        """Node in the window -> its pool when admitted."""
        self._in_pool: Tally[str] = Tally()
        """Nodes in the window per pool."""
        self.is_open = False
        """The fleet-wide breaker."""
        self.trips = 0
        self.tripped_at: datetime | None = None
        self.open_pools: dict[str, PoolTrip] = {}
        """Pools whose own breaker is open."""
        self.last_trip_pool: str | None = None
        """The scope the last TRIP opened: a pool's name, or None for the fleet."""
        self._blocked: set[str] = set()
        self._limit = 0
        self._pool_limits: dict[str, int] = {}
        self.version = 0
        """Bumped on every trip, reset, restore and node admitted to the window (the state
        syncer writes on change)."""

    @property
    def any_open(self) -> bool:
        """The fleet-wide breaker or a pool's is open."""
        return self.is_open or bool(self.open_pools)

    def limit(self, gpu_nodes: int) -> int:
        """The budget: ``max(min_nodes, floor(max_fraction x GPU nodes))`` (``min_nodes``: this
        breaker's part of it, when it was given one), at most
        :data:`~gpuhealth.controller.breaker.store.MAX_WINDOW` (what the stored window holds:
        a budget it could not hold would give a new leader fresh room)."""
        floor = self._min_nodes() if self._min_nodes is not None else self.settings.min_nodes
        budget = max(floor, math.floor(self.settings.max_fraction * gpu_nodes))
        return min(MAX_WINDOW, budget)

    def budgeted(self, pool: str) -> bool:
        """Does ``pool`` have a budget of its own (``per_pool``, and a named pool)?"""
        return self.settings.enabled and self.settings.per_pool and pool != NO_POOL

    def pool_limit(self, pool: str, pool_nodes: int) -> int:
        """The pool's budget: its ``breaker.pools`` entry, else the fleet-wide fraction and
        minimum, over the pool's GPU nodes."""
        own = self.settings.pools.get(pool)
        fraction = self.settings.max_fraction
        minimum = self.settings.min_nodes
        if own is not None:
            fraction = own.max_fraction if own.max_fraction is not None else fraction
            minimum = own.min_nodes if own.min_nodes is not None else minimum
        return min(MAX_WINDOW, max(minimum, math.floor(fraction * pool_nodes)))

    def _prune(self) -> None:
        horizon = self._clock.monotonic() - self.settings.window_s
        while self._recent and next(iter(self._recent.values())) < horizon:
            node, _ = self._recent.popitem(last=False)
            self._uncount(node)

    def _uncount(self, node: str) -> None:
        pool = self._pool_of.pop(node, NO_POOL)
        self._in_pool[pool] -= 1
        if self._in_pool[pool] <= 0:
            del self._in_pool[pool]

    def _admit(self, nodes: Iterable[tuple[str, str]]) -> None:
        mono = self._clock.monotonic()
        for node, pool in nodes:
            self._recent[node] = mono
            self._pool_of[node] = pool
            self._in_pool[pool] += 1
        self.version += 1

    def _trip(self, blocked: Iterable[str], pool: str | None) -> GateVerdict:
        """Open the fleet (``pool`` None) or a pool's breaker; past :data:`MAX_OPEN_POOLS`
        open pools, the fleet's instead."""
        now = self._clock.now()
        if pool is not None and len(self.open_pools) >= MAX_OPEN_POOLS:
            pool = None
        if pool is None:
            self.is_open = True
            self.trips += 1
            self.tripped_at = now
        else:
            prior = self.open_pools.get(pool)
            self.open_pools[pool] = PoolTrip(now, (prior.trips if prior else 0) + 1)
        self.last_trip_pool = pool
        self._blocked.update(blocked)
        self.version += 1
        return GateVerdict.TRIP

    def _held_pool(self, pools: Iterable[str]) -> bool:
        return any(self.budgeted(p) and p in self.open_pools for p in pools)

    def request(
        self, node: str, gpu_nodes: int, *, pool: str = NO_POOL, pool_nodes: int = 0
    ) -> GateVerdict:
        """May ``node`` (in ``pool``, of ``pool_nodes`` GPU nodes) gain a hard taint now? Only
        when the fleet-wide budget and its pool's both have room. An allowed request is
        counted at once, so that concurrent workers cannot overshoot the limit."""
        return self.request_group(
            (node,), gpu_nodes, pool_of={node: pool}.get, pool_nodes={pool: pool_nodes}.get
        )

    def request_group(
        self,
        nodes: Iterable[str],
        gpu_nodes: int,
        *,
        pool_of: Callable[[str], str | None] = lambda _node: NO_POOL,
        pool_nodes: Callable[[str], int | None] = lambda _pool: 0,
    ) -> GateVerdict:
        """May every one of ``nodes`` gain a hard taint now? All or none: the group (an
        NVLink domain, ``gpuhealth.controller.incidents.domain_monitor``) is admitted whole when its
        nodes not yet in the window fit in the budget together, else every one of them is blocked
        (and the request opens the breaker). Nodes admitted in the window stay admitted.

        Across pools the same holds for each: the group is admitted only when the fleet-wide
        budget and the budget of every pool its new nodes are in have room for them; else all
        of them wait, and the first pool (by name) without room opens (the members' other
        pools stay closed), or the fleet when it is the fleet that has none. A group with a
        member in an open pool waits with it."""
        if not self.settings.enabled:
            return GateVerdict.ALLOW
        self._prune()
        new = [(n, pool_of(n) or NO_POOL) for n in dict.fromkeys(nodes) if n not in self._recent]
        if not new:
            return GateVerdict.ALLOW  # admitted in this window: its whole verdict, even once open
        names = [n for n, _ in new]
        if self.is_open or self._held_pool(p for _, p in new):
            self._blocked.update(names)
            return GateVerdict.BLOCK
        per_pool = Tally(p for _, p in new if self.budgeted(p))
        for pool in sorted(per_pool):
            limit = self.pool_limit(pool, pool_nodes(pool) or 0)
            self._pool_limits[pool] = limit
            if self._in_pool[pool] + per_pool[pool] > limit:
                return self._trip(names, pool)
        self._limit = self.limit(gpu_nodes)
        if len(self._recent) + len(new) > self._limit:
            return self._trip(names, None)
        self._admit(new)
        return GateVerdict.ALLOW

    def reset(self) -> list[str]:
        """Operator action: close the fleet and every pool, forget the window; returns the
        nodes that were blocked (the caller requeues them)."""
        blocked = sorted(self._blocked)
        self.is_open = False
        self.open_pools.clear()
        self._recent.clear()
        self._pool_of.clear()
        self._in_pool.clear()
        self._blocked.clear()
        self.version += 1
        return blocked

    def restore(
        self,
        *,
        is_open: bool,
        trips: int,
        tripped_at: datetime | None,
        open_pools: Mapping[str, PoolTrip] | None = None,
    ) -> None:
        """Adopt the state a previous leader stored (an open breaker stays open, a pool open
        here or there stays open)."""
        self.is_open = self.is_open or is_open
        self.trips = max(self.trips, trips)
        if is_open:
            self.tripped_at = tripped_at
        for pool, trip in (open_pools or {}).items():
            prior = self.open_pools.get(pool)
            if prior is None or prior.trips < trip.trips:
                self.open_pools[pool] = trip
        self.version += 1

    def pool_admitted(self, pool: str) -> int:
        """The nodes of ``pool`` admitted within the window."""
        self._prune()
        return self._in_pool[pool]

    def admitted_pool(self, node: str) -> str:
        """The pool ``node`` was admitted in (:data:`NO_POOL` when none or not admitted)."""
        return self._pool_of.get(node, NO_POOL)

    def window(self) -> list[tuple[str, datetime]]:
        """The nodes admitted within the window, oldest first, with the wall-clock time of
        their admission (what the state syncer stores, with :meth:`admitted_pool`)."""
        self._prune()
        now, mono = self._clock.now(), self._clock.monotonic()
        return [(node, now - timedelta(seconds=mono - t)) for node, t in self._recent.items()]

    def restore_window(
        self, entries: Iterable[tuple[str, datetime]], pools: Mapping[str, str] | None = None
    ) -> None:
        """Adopt the window a previous leader stored (``pools``: each node's pool): nodes it
        admitted still count, against the fleet's and their pool's budgets, until their
        admission is ``window_s`` old (a restart gives no fresh budget)."""
        now, mono = self._clock.now(), self._clock.monotonic()
        merged = dict(self._recent)
        for node, at in entries:
            t = mono - max(0.0, (now - at).total_seconds())
            merged[node] = max(merged.get(node, t), t)
            if node not in self._pool_of:
                self._pool_of[node] = (pools or {}).get(node, NO_POOL)
        self._recent = OrderedDict(sorted(merged.items(), key=lambda kv: kv[1]))
        self._in_pool = Tally(self._pool_of[n] for n in self._recent)
        self._prune()
        self.version += 1

    def status(self) -> BreakerStatus:
        self._prune()
        names = sorted(set(self._in_pool) - {NO_POOL} | set(self.open_pools))
        return BreakerStatus(
            open=self.is_open,
            trips=self.trips,
            tripped_at=self.tripped_at,
            recent_nodes=len(self._recent),
            limit=self._limit,
            blocked_nodes=tuple(sorted(self._blocked)),
            enabled=self.settings.enabled,
            max_fraction=self.settings.max_fraction,
            window_s=self.settings.window_s,
            pools=tuple(
                PoolBreakerStatus(
                    pool=p,
                    open=p in self.open_pools,
                    recent_nodes=self._in_pool.get(p, 0),
                    limit=self._pool_limits.get(p, 0),
                    tripped_at=t.tripped_at if (t := self.open_pools.get(p)) else None,
                )
                for p in names
            ),
        )


log = get_logger("hard_writes")

HardWriteKind = Literal[
    "node-taint",
    "node-noexecute",
    "device-taint",
    "quarantine",
    "evict",
    "force-delete",
    "reset-gpu",
    "reboot",
    "replace-node",
]
HARD_WRITE_KINDS: tuple[HardWriteKind, ...] = (
    "node-taint",
    "node-noexecute",
    "device-taint",
    "quarantine",
    "evict",
    "force-delete",
    "reset-gpu",
    "reboot",
    "replace-node",
)

HELD_BY_DOMAIN: frozenset[HardWriteKind] = frozenset({"reset-gpu", "reboot", "replace-node"})
"""Hard writes refused on a node whose NVLink domain has an open incident (a reset, a reboot or
one tray's replacement cannot mend a shared fabric)."""

RESET_COMMAND = "gpuhealth-controller breaker reset"
NOT_LEADING = (
    "this replica does not hold the leader Lease, or has not loaded the leader's state yet "
    "(the breaker's ConfigMap)"
)
"""How an operator closes the breaker (docs/operations.md#circuit-breaker)."""


@dataclass(frozen=True, slots=True)
class HardWrite:
    node: str
    kind: HardWriteKind
    episode: str = ""
    """The remediation episode asking, if any."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GateDecision:
    allowed: bool
    tripped: bool = False
    """This request opened the breaker (the gate logged it and told its subscribers)."""
    reason: str = ""
    """CamelCase when refused: ``BreakerOpen`` or ``NotLeader``."""
    message: str = ""


ALLOWED = GateDecision(allowed=True)


class HardWriteGate(Protocol):
    """The single decision point for writes that disrupt workloads or take capacity away."""

    def request(self, write: HardWrite) -> GateDecision: ...


TripListener = Callable[[HardWrite, str], None]
"""Called with the write that opened the breaker and a sentence for people."""
ResetListener = Callable[[list[str]], None]
"""Called after a reset with the nodes whose hard writes were blocked."""


class GateMetrics:
    """``gpuhealth_hard_writes_total{kind, decision}`` and the breaker's trips."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.decisions = Counter(
            "gpuhealth_hard_writes",
            "Hard writes asked of the gate, by kind and decision (allowed, blocked, not_leader, "
            "domain_incident)",
            ["kind", "decision"],
            registry=registry,
        )
        self.trips = Counter(
            "gpuhealth_circuit_breaker_trips",
            "Times the fleet-wide circuit breaker opened",
            registry=registry,
        )
        self.pool_trips = Counter(
            "gpuhealth_circuit_breaker_pool_trips",
            "Times a node pool's own circuit breaker opened, by pool",
            ["pool"],
            registry=registry,
        )


class WriteGate:
    """:class:`HardWriteGate` over the circuit breaker and leadership."""

    def __init__(
        self,
        breaker: CircuitBreaker,
        *,
        gpu_nodes: Callable[[], int],
        leading: Callable[[], bool] = lambda: True,
        metrics: GateMetrics | None = None,
        pool_of: Callable[[str], str] = lambda _node: NO_POOL,
        pool_nodes: Callable[[str], int] = lambda _pool: 0,
    ) -> None:
        """``pool_of``: a node's pool; ``pool_nodes``: a pool's GPU nodes
        (``gpuhealth.controller.fleet.pools.NodePools``)."""
        self.breaker = breaker
        self._gpu_nodes = gpu_nodes
        self._leading = leading
        self.pool_of = pool_of
        self.pool_nodes = pool_nodes
        self.metrics = metrics or GateMetrics(None)
        self._on_trip: list[TripListener] = []
        self._on_reset: list[ResetListener] = []
        self.held: Callable[[str], str | None] = lambda _node: None
        """The open NVLink domain incident a node belongs to, if any
        (``gpuhealth.controller.incidents.domain_monitor``): its GPU resets and reboots are refused
        (``DomainIncident``): per-node remediation cannot mend a shared fabric."""

    def subscribe(
        self, *, on_trip: TripListener | None = None, on_reset: ResetListener | None = None
    ) -> None:
        """Parts that write hard (the reconciler, DRA, remediation) register when built."""
        if on_trip is not None:
            self._on_trip.append(on_trip)
        if on_reset is not None:
            self._on_reset.append(on_reset)

    def gpu_nodes(self) -> int:
        """The breaker's denominator: GPU nodes in the cluster (or reporting, if more)."""
        return self._gpu_nodes()

    def holding(self, node: str) -> str | None:
        """:attr:`held`, looked up at each call (it is set after the gate is built)."""
        return self.held(node)

    def request(self, write: HardWrite) -> GateDecision:
        if write.kind in HELD_BY_DOMAIN and (incident := self.held(write.node)) is not None:
            self.metrics.decisions.labels(write.kind, "domain_incident").inc()
            return GateDecision(
                allowed=False,
                reason="DomainIncident",
                message=(
                    f"the node's NVLink domain has an open incident ({incident}): a GPU reset or "
                    "reboot cannot mend a shared fabric; the operator decides "
                    "(docs/runbooks/GPUHealthNvlinkDomainIncident.md)"
                ),
            )
        if not self._leading():
            self.metrics.decisions.labels(write.kind, "not_leader").inc()
            log.warning("hard_write_refused_not_leader", node=write.node, kind=write.kind)
            return GateDecision(
                allowed=False,
                reason="NotLeader",
                message=NOT_LEADING,
            )
        gpu_nodes = self._gpu_nodes()
        pool = self.pool_of(write.node)
        verdict = self.breaker.request(
            write.node, gpu_nodes, pool=pool, pool_nodes=self.pool_nodes(pool)
        )
        if verdict is GateVerdict.ALLOW:
            self.metrics.decisions.labels(write.kind, "allowed").inc()
            return ALLOWED
        self.metrics.decisions.labels(write.kind, "blocked").inc()
        scope = "the circuit breaker is open"
        if not self.breaker.is_open and pool in self.breaker.open_pools:
            scope = f"the circuit breaker of node pool {pool} is open"
        message = (
            f"{scope}: new hard taints, device taints and disruptive "
            f"remediation steps wait for an operator's reset ({RESET_COMMAND})"
        )
        if verdict is GateVerdict.TRIP:
            self._tripped(write, gpu_nodes)
        return GateDecision(
            allowed=False,
            tripped=verdict is GateVerdict.TRIP,
            reason="BreakerOpen",
            message=message,
        )

    def request_group(
        self, nodes: Sequence[str], kind: HardWriteKind, *, detail: str = ""
    ) -> GateDecision:
        """Hard writes for a group of nodes (an NVLink domain's taint), all or none: allowed
        only on the leader and when the breaker admits every node of the group together
        (:meth:`CircuitBreaker.request_group`); a refusal holds the whole group."""
        if not nodes:
            return ALLOWED
        if not self._leading():
            self.metrics.decisions.labels(kind, "not_leader").inc()
            return GateDecision(
                allowed=False,
                reason="NotLeader",
                message=NOT_LEADING,
            )
        gpu_nodes = self._gpu_nodes()
        verdict = self.breaker.request_group(
            nodes, gpu_nodes, pool_of=self.pool_of, pool_nodes=self.pool_nodes
        )
        if verdict is GateVerdict.ALLOW:
            self.metrics.decisions.labels(kind, "allowed").inc(len(nodes))
            return ALLOWED
        self.metrics.decisions.labels(kind, "blocked").inc(len(nodes))
        if verdict is GateVerdict.TRIP:
            self._tripped(HardWrite(nodes[0], kind, detail=detail), gpu_nodes)
        return GateDecision(
            allowed=False,
            tripped=verdict is GateVerdict.TRIP,
            reason="BreakerOpen",
            message=(
                f"the circuit breaker holds all {len(nodes)} nodes of the group until an "
                f"operator resets it ({RESET_COMMAND})"
            ),
        )

    def _tripped(self, write: HardWrite, gpu_nodes: int) -> None:
        st = self.breaker.status()
        window = self.breaker.settings.window_s
        pool = self.breaker.last_trip_pool
        if pool is None:
            self.metrics.trips.inc()
            limit, of = st.limit, f"{gpu_nodes} GPU nodes"
            blocked = "new ones are blocked"
        else:
            self.metrics.pool_trips.labels(pool).inc()
            pools = {p.pool: p for p in st.pools}
            limit = pools[pool].limit if pool in pools else 0
            of = f"the {self.pool_nodes(pool)} GPU nodes of node pool {pool}"
            blocked = "new ones in that pool are blocked (the other pools go on)"
        log.error(
            "CIRCUIT_BREAKER_OPEN: hard writes are blocked until an operator resets it",
            node=write.node,
            kind=write.kind,
            pool=pool,
            limit=limit,
            gpu_nodes=gpu_nodes,
            window_s=window,
            runbook="docs/operations.md#circuit-breaker",
        )
        sentence = (
            f"gpuhealth circuit breaker opened: more than {limit} of {of} "
            f"would get a hard taint or disruption within {window:g}s; {blocked} "
            f"until an operator resets it ({RESET_COMMAND})"
        )
        for listener in self._on_trip:
            try:
                listener(write, sentence)
            except Exception:
                log.exception("hard_write_trip_listener_failed")

    def reset(self, *, by: str) -> list[str]:
        """Close the breaker (an operator's decision, ``by`` names who); subscribers take up
        the writes that were blocked. Returns the blocked nodes."""
        blocked = self.breaker.reset()
        log.warning("circuit_breaker_reset", by=by, blocked_nodes=len(blocked))
        for listener in self._on_reset:
            try:
                listener(blocked)
            except Exception:
                log.exception("hard_write_reset_listener_failed")
        return blocked
