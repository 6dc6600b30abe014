"""The one decision point for hard writes: every write that keeps work off a node or disrupts
it asks :class:`WriteGate` first.

A hard write is a Node's new NoSchedule/NoExecute taint (``node-taint``), a node's first
NoExecute taint (``node-noexecute``: it evicts pods even when the node is already cordoned),
a new DRA DeviceTaintRule (``device-taint``), and the remediation loop's disruptive steps
(``quarantine``, ``evict``, ``force-delete``, ``reset-gpu``, ``reboot``). Removing a taint or
a rule is never a hard write and is never blocked.

The gate answers from two facts: this replica leads (a replica that lost its Lease, or never
had it, writes nothing hard), and the circuit breaker has room for the node (one budget for
every kind: a node counts once per window however many kinds of hard write it gets). A
refusal that opens the breaker is a *trip*: the gate logs it, counts it and tells its
subscribers (the reconciler posts the ``CircuitBreakerOpen`` Event on the node). A reset
(:meth:`WriteGate.reset`, from the operator's authenticated ``POST /api/v1/breaker/reset`` or
the breaker's ConfigMap) closes the breaker and tells the subscribers to take up what was
blocked.

The remediation loop depends only on :class:`HardWriteGate` (``request``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker import CircuitBreaker, Verdict

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
        (``controller.domain_incidents``): its GPU resets and reboots are refused
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
                message="this replica does not hold the leader Lease",
            )
        gpu_nodes = self._gpu_nodes()
        verdict = self.breaker.request(write.node, gpu_nodes)
        if verdict is Verdict.ALLOW:
            self.metrics.decisions.labels(write.kind, "allowed").inc()
            return ALLOWED
        self.metrics.decisions.labels(write.kind, "blocked").inc()
        message = (
            "the circuit breaker is open: new hard taints, device taints and disruptive "
            f"remediation steps wait for an operator's reset ({RESET_COMMAND})"
        )
        if verdict is Verdict.TRIP:
            self._tripped(write, gpu_nodes)
        return GateDecision(
            allowed=False, tripped=verdict is Verdict.TRIP, reason="BreakerOpen", message=message
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
                message="this replica does not hold the leader Lease",
            )
        gpu_nodes = self._gpu_nodes()
        verdict = self.breaker.request_group(nodes, gpu_nodes)
        if verdict is Verdict.ALLOW:
            self.metrics.decisions.labels(kind, "allowed").inc(len(nodes))
            return ALLOWED
        self.metrics.decisions.labels(kind, "blocked").inc(len(nodes))
        if verdict is Verdict.TRIP:
            self._tripped(HardWrite(nodes[0], kind, detail=detail), gpu_nodes)
        return GateDecision(
            allowed=False,
            tripped=verdict is Verdict.TRIP,
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
