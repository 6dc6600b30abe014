"""NVLink domain incidents: what follows when a shared fabric is at fault.

:class:`DomainMonitor` reads the fleet (each node's GPUs' fabric membership and faults) and
the node cache (GPU feature discovery's clique label), asks the pure judge
(:func:`gpuhealth.controller.incidents.domains.judge_domains`) and carries the verdict out:

- ONE incident per domain in the :class:`~gpuhealth.controller.incidents.IncidentBook`
  (kind ``domain``, key = the domain id);
- every node of the domain gets the domain taint ``<prefix>/nvlink-domain=<domain>``
  (``domains.taint_effect``, NoSchedule by default), written by the reconciler like every
  taint (:meth:`taint_for` is its hook): the circuit breaker admits the domain whole
  (:meth:`WriteGate.request_group`) or holds it whole (decision ``domain held by breaker``,
  asked again at every evaluation, so an operator's reset admits it), never some nodes; a
  node that joins an admitted domain later asks the breaker alone, like any other node (held
  while the budget is spent, the rest staying tainted);
- GPU resets and reboots of its nodes are refused by the gate (:meth:`holding`): one
  decision for the operator, named in a Warning Event ``NvlinkDomainIncident`` on each node,
  the ``gpuhealth_nvlink_domain_incident`` gauge, the alert and its runbook
  (docs/runbooks/GPUHealthNvlinkDomainIncident.md);
- when every node that faulted reports again, fresh, with a healthy fabric (positive
  evidence: a silent, disconnected or not yet reconnected member keeps it open) the incident
  closes, the taint goes (only ours: the reconciler governs that key) and a Normal Event says
  so; an operator's resolve (:meth:`resolve`) closes it too, and a fault first seen before the
  resolution does not open it again.

A new leader adopts the open domains from their GPUIncidents before its first reconcile
(:meth:`adopt`: members, the nodes that faulted, admitted or held), so :meth:`taint_for`
answers for every member at once, before any agent reconnected; a member whose domain is not
known now (no clique label, its agent not back) stays a member while its Node exists.

Evaluated after changes (coalesced; a node's facts are read again only when its fleet health
or connection or its Node's clique label changed, and only the domains such a change touched
are judged) and every ``domains.evaluate_interval_s`` (the open domains). Only the
leader asks the breaker; a replica that does not lead records the incident and writes
nothing (the reconciler does not run there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, Gauge

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.gate import HardWriteKind, WriteGate
from gpuhealth.controller.fleet.model import ChangeKind, Fleet
from gpuhealth.controller.incidents import IncidentBook, Subjects
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.incidents.domains import (
    DomainVerdict,
    NodeFabric,
    domain_claim,
    fabric_fault,
    judge_domains,
)
from gpuhealth.controller.incidents.lifecycle import OnCallAction, resolution
from gpuhealth.controller.incidents.model import DomainDecision, Incident
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.kube.node_cache import Change, NodeCache
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import (
    EVENT_NVLINK_DOMAIN_INCIDENT,
    EVENT_NVLINK_DOMAIN_MISMATCH,
    EVENT_NVLINK_DOMAIN_RECOVERED,
    Keys,
)
from gpuhealth.controller.taints.policy import Taint
from gpuhealth.controller.taints.reconciler import Reconciler

log = get_logger("domain_incidents")

TAINTED = "domain taint"
HELD = "domain held by breaker"
NOT_LEADING = "domain incident (this replica does not lead: no writes)"
RUNBOOK = "docs/runbooks/GPUHealthNvlinkDomainIncident.md"
MAX_RESOLVED = 10000
"""Domains whose resolution time, or closed incident, is remembered (the oldest forgotten
first)."""


class DomainMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.incident = Gauge(
            "gpuhealth_nvlink_domain_incident",
            "1 for each NVLink domain with an open incident, by decision (tainted, held)",
            ["domain", "decision"],
            registry=registry,
        )
        self.nodes = Gauge(
            "gpuhealth_nvlink_domain_nodes",
            "Nodes of NVLink domains with an open incident, by decision (tainted, held)",
            ["decision"],
            registry=registry,
        )
        self.mismatched = Gauge(
            "gpuhealth_nvlink_domain_mismatch_nodes",
            "Nodes whose agent reports an NVLink domain other than their clique label's (the "
            "label's counts)",
            registry=registry,
        )


@dataclass(slots=True)
class _Open:
    nodes: tuple[str, ...]
    admitted: bool
    decision: str
    faulted: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    """Nodes that joined the domain after it was admitted and that the breaker holds (asked
    again at every evaluation): like any other node, never tainted past a spent budget."""


class DomainMonitor:
    def __init__(
        self,
        settings: DomainSettings,
        keys: Keys,
        *,
        fleet: Fleet,
        cache: NodeCache,
        book: IncidentBook,
        gate: WriteGate,
        clock: Clock,
        leading: Callable[[], bool],
        enqueue: Callable[[str], None] = lambda _node: None,
        event: Callable[[str, KubeEvent], None] = lambda _node, _ev: None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.fleet = fleet
        self.cache = cache
        self.book = book
        self.gate = gate
        self.clock = clock
        self._leading = leading
        self._enqueue = enqueue
        self._event = event
        self.metrics = DomainMetrics(registry)
        self._open: dict[str, _Open] = {}
        self._node_domain: dict[str, str] = {}
        """Node -> the domain of its open incident."""
        self._facts: dict[str, NodeFabric] = {}
        """Node -> its fabric facts (nodes in a domain), as of its last change."""
        self._members: dict[str, set[str]] = {}
        """Domain -> its nodes (those of ``_facts``)."""
        self._dirty: set[str] = set()
        """Nodes changed since the last evaluation (fleet health or connection, the Node's
        clique label, added or removed)."""
        self._read_all = True
        """The first evaluation reads every node."""
        self._mismatch: dict[str, str] = {}
        """Node -> the domain its agent claims against its clique label."""
        self._resolved: dict[str, datetime] = {}
        """Domain -> when an operator resolved its incident: faults first seen before do not
        count."""
        self._closed: dict[str, None] = {}
        """Domains whose incident this replica knows closed (it closed it, or adopted it
        closed): their taint may go from a node without data."""
        self._wake = asyncio.Event()
        """Set by a change: the run loop evaluates at once (changes coalesce: one evaluation
        however many reports arrived meanwhile, reading only the changed nodes)."""
        self.on_opened: Callable[[str, datetime], None] | None = None
        """Test hook: called with the domain and the time its incident opened."""
        fleet.subscribe(self._on_fleet)
        cache.subscribe(self._on_node)

    # -- hooks for the reconciler and the gate ------------------------------------------------

    def taint_for(self, node: str) -> Taint | None:
        """The domain taint ``node`` should carry now (its domain's incident is open and the
        breaker admitted the domain), else None."""
        domain = self._node_domain.get(node)
        if domain is None:
            return None
        entry = self._open.get(domain)
        if entry is None or not entry.admitted or node in entry.held:
            return None
        return Taint(self.keys.domain_taint, domain, self.settings.taint_effect)

    def knows(self, domain: str) -> bool:
        """Does this replica know the incident of ``domain`` (open, or closed)? The reconciler
        removes a domain taint from a node without data only then: a taint whose incident's
        object never reached the API server (the leader died in between) stays until the
        node's agent reports."""
        return domain in self._open or domain in self._closed

    def holding(self, node: str) -> str | None:
        """The open domain incident ``node`` belongs to (its GPU resets wait), else None."""
        domain = self._node_domain.get(node)
        return None if domain is None else f"NVLink domain {domain}"

    # -- evaluation ---------------------------------------------------------------------------

    def _on_fleet(self, node: str, kind: ChangeKind) -> None:
        if kind in ("health", "connection", "removed"):
            self._changed(node)

    def _on_node(self, change: Change, old: NodeView | None, new: NodeView | None) -> None:
        labels = (self.settings.clique_label, *self.settings.topology_labels)
        if old is None or new is None:  # added or deleted
            if (view := new or old) is not None:
                self._changed(view.name)
        elif any(old.labels.get(k) != new.labels.get(k) for k in labels):
            self._changed(new.name)

    def _changed(self, node: str) -> None:
        self._dirty.add(node)
        self._wake.set()

    def _fact(self, name: str, now: datetime) -> NodeFabric | None:
        """The node's domain and its oldest fabric fault; None when it is in no domain."""
        view = self.cache.get(name)
        if view is None:
            return None
        rec = self.fleet.node(name)
        gpus = list(rec.gpus.values()) if rec is not None else []
        label = view.labels.get(self.settings.clique_label)
        rack = next(
            (view.labels[k] for k in self.settings.topology_labels if k in view.labels), None
        )
        domain, claimed = domain_claim(
            (g.fabric.domain if g.fabric is not None else None for g in gpus), label, rack
        )
        self._cross_check(name, claimed, domain)
        if domain is None:
            return None
        since, code = (None, "")
        if rec is not None and rec.has_snapshot and not rec.silent:
            since, code = fabric_fault(
                (c for g in gpus for c in g.conditions),
                rec.node_conditions,
                self.settings,
                now,
                after=self._resolved.get(domain),
            )
        reporting = rec is not None and rec.connected and rec.has_snapshot and not rec.silent
        return NodeFabric(name, domain, since, code, reporting)

    def _cross_check(self, node: str, claimed: str | None, labelled: str | None) -> None:
        """A Warning Event when a node's agent starts claiming a domain its clique label
        denies (once per claim); the gauge counts such nodes."""
        before = self._mismatch.get(node)
        if claimed is None:
            self._mismatch.pop(node, None)
        elif claimed != before:
            self._mismatch[node] = claimed
            log.warning("nvlink_domain_mismatch", node=node, claimed=claimed, label=labelled)
            message = (
                f"the agent reports NVLink domain {claimed}, the node's clique label "
                f"{labelled}: the label's counts (the agent's claim moves no domain)"
            )
            self._event(node, KubeEvent("Warning", EVENT_NVLINK_DOMAIN_MISMATCH, message))
        self.metrics.mismatched.set(len(self._mismatch))

    def _refresh(self, now: datetime) -> set[str]:
        """Bring the facts of the changed nodes up to date: the domains they left or joined.
        A heartbeat storm of 20,000 agents costs one lookup per changed node, not a pass over
        the fleet per evaluation (bench ``fleet_scale``)."""
        if self._read_all:
            self._read_all = False
            names = {v.name for v in self.cache.views()} | set(self._facts) | self._dirty
        else:
            names = self._dirty
        self._dirty = set()
        touched: set[str] = set()
        for name in names:
            old = self._facts.pop(name, None)
            if old is not None and old.domain is not None:
                touched.add(old.domain)
                members = self._members[old.domain]
                members.discard(name)
                if not members:
                    del self._members[old.domain]
            new = self._fact(name, now)
            if new is not None and new.domain is not None:
                self._facts[name] = new
                self._members.setdefault(new.domain, set()).add(name)
                touched.add(new.domain)
        return touched

    def facts(self) -> list[NodeFabric]:
        """Every node's fabric facts (those of changed nodes read again)."""
        self._refresh(self.clock.now())
        return list(self._facts.values())

    def evaluate(self) -> list[DomainVerdict]:
        """Judge the domains a change touched and every open one (an incident closes, the
        breaker's reset admits a held domain) and carry the verdicts out (no I/O: the
        reconciler writes); the verdicts of those domains."""
        if not self.settings.enabled:
            return []
        now = self.clock.now()
        domains = self._refresh(now) | set(self._open)
        group = [self._facts[n] for d in domains for n in self._members.get(d, ())]
        group += self._unknown_members()
        faulted = {d: e.faulted for d, e in self._open.items()}
        verdicts = judge_domains(group, faulted, self.settings)
        seen = set()
        for v in verdicts:
            seen.add(v.domain)
            if v.incident:
                self._keep_open(v, now)
            elif v.domain in self._open:
                self._close(v.domain, now, "every node that faulted reports a healthy fabric again")
        for domain in [d for d in self._open if d not in seen]:
            self._close(domain, now, "the domain has no node any more")
        self._export()
        return verdicts

    def _unknown_members(self) -> list[NodeFabric]:
        """Members of open domains whose domain is not known now (no clique label, its agent
        not reporting its GPUs' fabric: after a controller start) and whose Node exists: still
        members, not reporting."""
        out = []
        for domain, entry in self._open.items():
            for name in entry.nodes:
                if name not in self._facts and self.cache.get(name) is not None:
                    out.append(NodeFabric(name, domain, reporting=False))
        return out

    def _keep_open(self, v: DomainVerdict, now: datetime) -> None:
        prior = self._open.get(v.domain)
        held: tuple[str, ...] = ()
        if prior is not None and prior.admitted:
            # Tainted already: only the nodes not tainted yet (newcomers, held ones) ask the
            # breaker, like any other node; a refusal holds them, the rest stay tainted.
            admitted, decision = True, TAINTED
            asking = tuple(n for n in v.nodes if n not in prior.nodes or n in prior.held)
            if asking and not self._admit(v.domain, asking)[0]:
                held = asking
        else:
            admitted, decision = self._admit(v.domain, v.nodes)
        entry = _Open(v.nodes, admitted, decision, v.faulted, held)
        changed = (
            prior is None
            or prior.nodes != v.nodes
            or prior.admitted != admitted
            or prior.held != held
        )
        self._open[v.domain] = entry
        self._closed.pop(v.domain, None)
        for node, domain in list(self._node_domain.items()):
            if domain == v.domain and node not in v.nodes:
                del self._node_domain[node]
                self._enqueue(node)
        for node in v.nodes:
            self._node_domain[node] = v.domain
        evidence = {"nodes": len(v.nodes), "faulty_nodes": len(v.faulty)}
        if v.waiting:
            evidence["waiting_nodes"] = len(v.waiting)
        if held:
            evidence["held_nodes"] = len(held)
        self.book.open(
            "domain",
            v.domain,
            subjects=Subjects(nodes=v.nodes, domain=v.domain),
            decision=decision,
            reason=v.reason,
            now=now,
            evidence=evidence,
            domain=DomainDecision(v.nodes, v.faulted, admitted, held),
        )
        if prior is None:
            log.warning(
                "nvlink_domain_incident",
                domain=v.domain,
                nodes=len(v.nodes),
                faulty=list(v.faulty),
                decision=decision,
                runbook=RUNBOOK,
            )
            if self.on_opened is not None:
                self.on_opened(v.domain, now)
            message = (
                f"{v.reason}. Decision: {decision}; GPU resets and reboots of the domain's "
                f"nodes wait for the operator ({RUNBOOK})"
            )
            for node in v.nodes:
                self._event(
                    node, KubeEvent("Warning", EVENT_NVLINK_DOMAIN_INCIDENT, message[:1024])
                )
        if changed:
            for node in v.nodes:
                self._enqueue(node)

    def _admit(self, domain: str, nodes: Sequence[str]) -> tuple[bool, str]:
        if not self._leading():
            return False, NOT_LEADING
        kinds: list[HardWriteKind] = []
        if self.settings.taint_effect in ("NoSchedule", "NoExecute"):
            kinds.append("node-taint")
        if not kinds:
            return True, TAINTED  # PreferNoSchedule keeps nothing off: never gated
        decision = self.gate.request_group(
            nodes, kinds[0], detail=f"{self.keys.domain_taint}={domain}"
        )
        return (True, TAINTED) if decision.allowed else (False, HELD)

    def _close(self, domain: str, now: datetime, why: str) -> None:
        entry = self._open.pop(domain, None)
        if entry is None:
            return
        self._remember_closed(domain)
        for node in [n for n, d in self._node_domain.items() if d == domain]:
            del self._node_domain[node]
        incident = self.book.find("domain", domain)
        if incident is not None:
            self.book.close(incident.id, now, reason=why)
        log.info("nvlink_domain_incident_closed", domain=domain, reason=why)
        for node in entry.nodes:
            self._event(
                node, KubeEvent("Normal", EVENT_NVLINK_DOMAIN_RECOVERED, f"{domain}: {why}")
            )
            self._enqueue(node)

    # -- a new leader, an operator ---------------------------------------------------------------

    def adopt(self, incidents: Sequence[Incident]) -> None:
        """Take the stored domain incidents over (a new leader, before its first reconcile):
        each open one's members, the nodes that faulted and whether the breaker admitted it;
        each resolved one's resolution time. Open domains this replica judged itself and no
        object holds stay as they are."""
        for i in incidents:
            if i.kind != "domain":
                continue
            seen = i.observed.resolved
            if seen is not None and seen.applied:
                self._remember_resolution(i.key, seen.seen_at)
            if not i.open and i.key not in self._open:
                self._remember_closed(i.key)
            if i.open and i.domain is not None:
                d = i.domain
                decision = TAINTED if d.admitted else HELD
                self._open[i.key] = _Open(d.members, d.admitted, decision, d.faulted, d.held)
        self._node_domain = {n: d for d, e in self._open.items() for n in e.nodes}
        self._read_all = True
        self._wake.set()
        self._export()

    def keep_only(self, owns: Callable[[str], bool]) -> list[str]:
        """Past one process, this replica's shards changed: forget the open domains none of
        whose nodes it owns now (their shard's owner decides them; this replica must not
        close them for want of reports it no longer receives); returns them."""
        gone = [d for d, e in self._open.items() if not any(owns(n) for n in e.nodes)]
        for domain in gone:
            del self._open[domain]
        if gone:
            self._node_domain = {n: d for d, e in self._open.items() for n in e.nodes}
            self._export()
        return gone

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        """An operator resolved the domain's incident: it closes, the domain taint goes, and
        faults first seen before now do not open it again (a new fault does)."""
        now = self.clock.now()
        self._remember_resolution(incident.key, now)
        self._close(incident.key, now, resolution(action))
        self._dirty.update(incident.subjects.nodes)
        self._export()

    def _remember_closed(self, domain: str) -> None:
        self._closed.pop(domain, None)
        self._closed[domain] = None
        while len(self._closed) > MAX_RESOLVED:
            del self._closed[next(iter(self._closed))]

    def _remember_resolution(self, domain: str, at: datetime) -> None:
        self._resolved.pop(domain, None)
        self._resolved[domain] = at
        while len(self._resolved) > MAX_RESOLVED:
            del self._resolved[next(iter(self._resolved))]

    def _export(self) -> None:
        self.metrics.incident.clear()
        by_decision = {"tainted": 0, "held": 0}
        for domain, entry in self._open.items():
            label = "tainted" if entry.admitted else "held"
            self.metrics.incident.labels(domain, label).set(1)
            by_decision[label] += len(entry.nodes)
        for label, n in by_decision.items():
            self.metrics.nodes.labels(label).set(n)

    async def run(self) -> None:
        """Evaluate after every fleet health change (coalesced) and every
        ``evaluate_interval_s`` (closes incidents, admits a held domain after the breaker's
        reset) until cancelled."""
        while True:
            self._wake.clear()
            self.evaluate()
            sleep = asyncio.ensure_future(self.clock.sleep(self.settings.evaluate_interval_s))
            wake = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleep, wake}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleep.cancel()
                wake.cancel()


def build_domain_monitor(
    settings: DomainSettings,
    keys: Keys,
    *,
    fleet: Fleet,
    cache: NodeCache,
    book: IncidentBook,
    gate: WriteGate,
    clock: Clock,
    leading: Callable[[], bool],
    reconciler: Reconciler,
    registry: CollectorRegistry | None,
) -> DomainMonitor:
    """The monitor, hooked into the reconciler (the domain taint) and the gate (no GPU resets
    or reboots of a node in an open domain incident)."""
    monitor = DomainMonitor(
        settings,
        keys,
        fleet=fleet,
        cache=cache,
        book=book,
        gate=gate,
        clock=clock,
        leading=leading,
        enqueue=reconciler.enqueue,
        event=reconciler.queue_event,
        registry=registry,
    )
    reconciler.domain = monitor.taint_for
    reconciler.domain_known = monitor.knows
    gate.held = monitor.holding
    return monitor
