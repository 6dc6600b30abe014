"""The circuit breaker and the one gate every hard write asks.

The one decision point for hard writes: every write that keeps work off a node or disrupts
it asks :class:`WriteGate` first.

A hard write is a Node's new NoSchedule/NoExecute taint (``node-taint``), a node's first
NoExecute taint (``node-noexecute``: it evicts pods even when the node is already cordoned),
a new DRA DeviceTaintRule (``device-taint``), and the remediation loop's disruptive steps
(``quarantine``, ``evict``, ``force-delete``, ``reset-gpu``, ``reboot``). Removing a taint or
a rule is never a hard write and is never blocked.

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
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker.store import MAX_WINDOW


class GateVerdict(Enum):
    ALLOW = "allow"
    BLOCK = "block"
    TRIP = "trip"
    """Blocked, and this request opened the breaker (emit the Event, log loudly)."""


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


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings | None = None, clock: Clock | None = None) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock or SystemClock()
        self._recent: OrderedDict[str, float] = OrderedDict()
        """Node -> monotonic time it was allowed a new hard taint, oldest first."""
        self.is_open = False
        self.trips = 0
        self.tripped_at: datetime | None = None
        self._blocked: set[str] = set()
        self._limit = 0
        self.version = 0
        """Bumped on every trip, reset, restore and node admitted to the window (the state
        syncer writes on change)."""

    def limit(self, gpu_nodes: int) -> int:
        """The budget: ``max(min_nodes, floor(max_fraction x GPU nodes))``, at most
        :data:`~gpuhealth.controller.breaker.store.MAX_WINDOW` (what the stored window holds:
        a budget it could not hold would give a new leader fresh room)."""
        budget = max(self.settings.min_nodes, math.floor(self.settings.max_fraction * gpu_nodes))
        return min(MAX_WINDOW, budget)

    def _prune(self) -> None:
        horizon = self._clock.monotonic() - self.settings.window_s
        while self._recent and next(iter(self._recent.values())) < horizon:
            self._recent.popitem(last=False)

    def request(self, node: str, gpu_nodes: int) -> GateVerdict:
        """May ``node`` gain a hard taint now? An allowed request is counted at once, so that
        concurrent workers cannot overshoot the limit."""
        if not self.settings.enabled:
            return GateVerdict.ALLOW
        self._prune()
        if node in self._recent:
            return GateVerdict.ALLOW  # admitted in this window: its whole verdict, even once open
        if self.is_open:
            self._blocked.add(node)
            return GateVerdict.BLOCK
        self._limit = self.limit(gpu_nodes)
        if len(self._recent) + 1 > self._limit:
            self.is_open = True
            self.trips += 1
            self.tripped_at = self._clock.now()
            self._blocked.add(node)
            self.version += 1
            return GateVerdict.TRIP
        self._recent[node] = self._clock.monotonic()
        self.version += 1
        return GateVerdict.ALLOW

    def request_group(self, nodes: Iterable[str], gpu_nodes: int) -> GateVerdict:
        """May every one of ``nodes`` gain a hard taint now? All or none: the group (an
        NVLink domain, ``gpuhealth.controller.incidents.domain_monitor``) is admitted whole when its
        nodes not yet in the window fit in the budget together, else every one of them is blocked
        (and the request opens the breaker). Nodes admitted in the window stay admitted."""
        if not self.settings.enabled:
            return GateVerdict.ALLOW
        self._prune()
        new = [n for n in dict.fromkeys(nodes) if n not in self._recent]
        if not new:
            return GateVerdict.ALLOW
        if self.is_open:
            self._blocked.update(new)
            return GateVerdict.BLOCK
        self._limit = self.limit(gpu_nodes)
        if len(self._recent) + len(new) > self._limit:
            self.is_open = True
            self.trips += 1
            self.tripped_at = self._clock.now()
            self._blocked.update(new)
            self.version += 1
            return GateVerdict.TRIP
        mono = self._clock.monotonic()
        for n in new:
            self._recent[n] = mono
        self.version += 1
        return GateVerdict.ALLOW

    def reset(self) -> list[str]:
        """Operator action: close, forget the window; returns the nodes that were blocked
        (the caller requeues them)."""
        blocked = sorted(self._blocked)
        self.is_open = False
        self._recent.clear()
        self._blocked.clear()
        self.version += 1
        return blocked

    def restore(self, *, is_open: bool, trips: int, tripped_at: datetime | None) -> None:
        """Adopt the state a previous leader stored (an open breaker stays open)."""
        self.is_open = is_open
        self.trips = max(self.trips, trips)
        self.tripped_at = tripped_at
        self.version += 1

    def window(self) -> list[tuple[str, datetime]]:
        """The nodes admitted within the window, oldest first, with the wall-clock time of
        their admission (what the state syncer stores)."""
        self._prune()
        now, mono = self._clock.now(), self._clock.monotonic()
        return [(node, now - timedelta(seconds=mono - t)) for node, t in self._recent.items()]

    def restore_window(self, entries: Iterable[tuple[str, datetime]]) -> None:
        """Adopt the window a previous leader stored: nodes it admitted still count until
        their admission is ``window_s`` old (a restart gives no fresh budget)."""
        now, mono = self._clock.now(), self._clock.monotonic()
        merged = dict(self._recent)
        for node, at in entries:
            t = mono - max(0.0, (now - at).total_seconds())
            merged[node] = max(merged.get(node, t), t)
        self._recent = OrderedDict(sorted(merged.items(), key=lambda kv: kv[1]))
        self._prune()
        self.version += 1

    def status(self) -> BreakerStatus:
        self._prune()
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
)

HELD_BY_DOMAIN: frozenset[HardWriteKind] = frozenset({"reset-gpu", "reboot"})
"""Hard writes refused on a node whose NVLink domain has an open incident."""

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
            "gpuhealth_circuit_breaker_trips", "Times the circuit breaker opened", registry=registry
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
    ) -> None:
        self.breaker = breaker
        self._gpu_nodes = gpu_nodes
        self._leading = leading
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
        verdict = self.breaker.request(write.node, gpu_nodes)
        if verdict is GateVerdict.ALLOW:
            self.metrics.decisions.labels(write.kind, "allowed").inc()
            return ALLOWED
        self.metrics.decisions.labels(write.kind, "blocked").inc()
        message = (
            "the circuit breaker is open: new hard taints, device taints and disruptive "
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
        verdict = self.breaker.request_group(nodes, gpu_nodes)
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
        self.metrics.trips.inc()
        log.error(
            "CIRCUIT_BREAKER_OPEN: hard writes are blocked until an operator resets it",
            node=write.node,
            kind=write.kind,
            limit=st.limit,
            gpu_nodes=gpu_nodes,
            window_s=window,
            runbook="docs/operations.md#circuit-breaker",
        )
        sentence = (
            f"gpuhealth circuit breaker opened: more than {st.limit} of {gpu_nodes} GPU nodes "
            f"would get a hard taint or disruption within {window:g}s; new ones are blocked "
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
