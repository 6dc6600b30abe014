"""An in-memory world for the remediation runner: every port, with Kubernetes' semantics
where they matter (resourceVersion conflicts, the Eviction API's PDB check, pods that
terminate after eviction) and an agent that resets, reboots and validates like a real one
(a reset clears the verdict, a reboot changes the boot id, orders are deduplicated by id).

Used by the unit tests of the runner; the Kubernetes adapters have their own integration
tests against a real API server.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gpuhealth.controller.fleet.pools import NO_POOL, pool_of
from gpuhealth.controller.kube.rest import ConflictError
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.action_reports import ReportBook
from gpuhealth.controller.remediation.actions import ReplaceNode
from gpuhealth.controller.remediation.drain import selects
from gpuhealth.controller.remediation.facts import (
    GpuFacts,
    NodeFacts,
    PdbFacts,
    PodFacts,
    ValidationPodFacts,
)
from gpuhealth.controller.remediation.gang import Gang
from gpuhealth.controller.remediation.model import Episode, Spec, Status, initial_status
from gpuhealth.controller.remediation.orders import ORDER_KINDS
from gpuhealth.controller.remediation.outcomes import EvictionOutcome, ReplaceOutcome
from gpuhealth.controller.remediation.replacing import holds_cordon
from gpuhealth.controller.remediation.safety import GateDecision, HardWrite
from gpuhealth.controller.remediation.step import Note
from gpuhealth.controller.remediation.taint import quarantine_taint
from gpuhealth.protocol import Allocation, Condition
from gpuhealth.protocol.remediation import (
    ActionReport,
    CheckResult,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)
from tests.support.clock import FakeClock

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
KEYS = Keys()


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:04d}-aaaa-bbbb-cccc-dddddddddddd"


def fault_condition(
    code: str = "xid-79", action: str = "RESTART_BM", since: datetime = T0
) -> Condition:
    return Condition(reason="XidError", code=code, severity="unhealthy", action=action, since=since)


def node_facts(
    name: str = "node-a",
    *,
    boot_id: str = "boot-1",
    unhealthy: Mapping[int, Condition] | None = None,
    gpus: int = 8,
    allocations: tuple[Allocation, ...] | None = (),
    labels: Mapping[str, str] | None = None,
    **more: Any,
) -> NodeFacts:
    """``more``: other NodeFacts fields (uid, owners, conditions, pool ...)."""
    bad = dict(unhealthy or {})
    return NodeFacts(
        name=name,
        uid=more.pop("uid", f"uid-{name}"),
        pool=more.pop("pool", pool_of(labels or {})),
        **more,
        boot_id=boot_id,
        gpus=tuple(
            GpuFacts(
                uuid=gpu_uuid(i),
                index=i,
                state="unhealthy" if i in bad else "healthy",
                conditions=(bad[i],) if i in bad else (),
            )
            for i in range(gpus)
        ),
        allocations=allocations,
        labels=dict(labels or {}),
    )


def pod(
    name: str,
    node: str = "node-a",
    *,
    namespace: str = "work",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owners: tuple[tuple[str, str], ...] = (),
    gpus: int = 1,
    phase: str = "Running",
) -> PodFacts:
    return PodFacts(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        node=node,
        phase=phase,
        labels=dict(labels or {}),
        annotations=dict(annotations or {}),
        owners=owners,
        gpu_request=gpus,
        grace_period_s=30,
    )


class Store:
    """GPURemediation objects with resourceVersion semantics."""

    def __init__(self) -> None:
        self.objects: dict[str, Episode] = {}
        self._rv = itertools.count(1)
        self.writes = 0
        self.conflict_next = 0
        """Answer the next N status writes with 409 (a concurrent writer)."""

    def episodes(self) -> list[Episode]:
        return list(self.objects.values())

    def get(self, name: str) -> Episode | None:
        return self.objects.get(name)

    async def create(self, name: str, spec: Spec, labels: Mapping[str, str]) -> Episode | None:
        if name in self.objects:
            return None
        ep = Episode(
            name=name,
            uid=f"uid-{name}",
            resource_version=str(next(self._rv)),
            created=spec.fault.detected_at,
            labels=dict(labels),
            spec=spec,
            status=initial_status(spec.fault.detected_at),
        )
        self.objects[name] = ep
        return ep

    async def write_status(self, ep: Episode, status: Status) -> Episode:
        cur = self.objects.get(ep.name)
        if cur is None or cur.resource_version != ep.resource_version:
            raise ConflictError(f"{ep.name}: resourceVersion moved", 409)
        if self.conflict_next:
            self.conflict_next -= 1
            raise ConflictError(f"{ep.name}: injected conflict", 409)
        # the API server round-trips the object: a status that cannot be encoded fails here
        msgspec.json.decode(msgspec.json.encode(status), type=Status)
        new = msgspec.structs.replace(cur, status=status, resource_version=str(next(self._rv)))
        self.objects[ep.name] = new
        self.writes += 1
        return new

    def annotate(self, name: str, key: str, value: str) -> None:
        cur = self.objects[name]
        ann = {**cur.annotations, key: value}
        self.objects[name] = msgspec.structs.replace(
            cur, annotations=ann, resource_version=str(next(self._rv))
        )

    async def delete(self, name: str) -> None:
        self.objects.pop(name, None)


@dataclass
class AgentBehaviour:
    reset: str = "succeeded"
    """succeeded, failed, or refused (gpu-busy)."""
    reboot: bool = True
    """A reboot order reboots (boot id changes at the next :meth:`World.settle`)."""
    validate: str = "succeeded"
    connected: bool = True


@dataclass
class World:
    """Every port of the runner in memory. Call :meth:`settle` to let time-free side
    effects happen (pods terminate, a rebooted node comes back)."""

    clock: FakeClock = field(default_factory=lambda: FakeClock(start=T0))
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    pods_by_uid: dict[str, PodFacts] = field(default_factory=dict)
    pdbs_list: list[PdbFacts] = field(default_factory=list)
    store: Store = field(default_factory=Store)
    book: ReportBook = field(default_factory=ReportBook)
    agent: AgentBehaviour = field(default_factory=AgentBehaviour)
    executed: Counter[str] = field(default_factory=Counter)
    """Order ids the agent executed (a second execution of one id is a bug)."""
    results: dict[str, ActionReport] = field(default_factory=dict)
    evicted: list[str] = field(default_factory=list)
    eviction_attempts: Counter[str] = field(default_factory=Counter)
    blocked: list[str] = field(default_factory=list)
    force_deleted: list[str] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    validation_pods: dict[str, ValidationPodFacts] = field(default_factory=dict)
    pending_reboots: set[str] = field(default_factory=set)
    gate_open: bool = True
    gate_requests: list[HardWrite] = field(default_factory=list)
    nodeclaims: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    """Karpenter NodeClaims: name -> (uid, node, pool)."""
    replaced: list[tuple[str, str]] = field(default_factory=list)
    """(method, what) of every delete the replacer sent."""
    replacer_fails: int = 0
    """The next N deletes are sent and then answer nothing (a lost answer, a crash)."""
    statuses_at_delete: list[str] = field(default_factory=list)
    """The episode's replacement state as stored when each delete was sent (written ahead)."""
    seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    quarantine_requests: Counter[str] = field(default_factory=Counter)

    def add(self, *pods: PodFacts) -> None:
        for p in pods:
            self.pods_by_uid[p.uid] = p

    # NodeSource
    def node(self, name: str) -> NodeFacts | None:
        return self.nodes.get(name)

    def gpu_nodes(self) -> int:
        return len(self.nodes)

    def pool(self, name: str) -> str:
        facts = self.nodes.get(name)
        return pool_of(facts.labels) if facts is not None else NO_POOL

    def pool_nodes(self, pool: str) -> int:
        return sum(1 for f in self.nodes.values() if pool_of(f.labels) == pool)

    def candidates(self) -> list[str]:
        return sorted(
            n for n, f in self.nodes.items() if any(g.state == "unhealthy" for g in f.gpus)
        )

    # PodReader
    async def pods_on_node(self, node: str) -> list[PodFacts]:
        return [p for p in self.pods_by_uid.values() if p.node == node]

    async def gang_members(self, gang: Gang) -> list[PodFacts]:
        return [p for p in self.pods_by_uid.values() if gang.has(p)]

    async def pod(self, namespace: str, name: str) -> PodFacts | None:
        return next(
            (p for p in self.pods_by_uid.values() if (p.namespace, p.name) == (namespace, name)),
            None,
        )

    async def pdbs(self, namespace: str) -> list[PdbFacts]:
        return [d for d in self.pdbs_list if d.namespace == namespace]

    async def validation_pod(self, namespace: str, name: str) -> ValidationPodFacts | None:
        return self.validation_pods.get(name)

    # Disruptor
    async def evict(self, p: PodFacts, grace_period_s: int | None) -> tuple[EvictionOutcome, str]:
        self.eviction_attempts[p.uid] += 1
        cur = self.pods_by_uid.get(p.uid)
        if cur is None:
            return "gone", ""
        if cur.deletion_timestamp is not None:
            return "evicted", ""
        for i, pdb in enumerate(self.pdbs_list):
            if selects(pdb, cur):
                if pdb.disruptions_allowed < 1:
                    self.blocked.append(p.name)
                    return "blocked", f"disruption budget {pdb.name} refuses"
                self.pdbs_list[i] = replace(pdb, disruptions_allowed=pdb.disruptions_allowed - 1)
        self.pods_by_uid[p.uid] = replace(cur, deletion_timestamp=self.clock.now())
        self.evicted.append(p.name)
        return "evicted", ""

    async def force_delete(self, p: PodFacts) -> None:
        self.force_deleted.append(p.name)
        self.pods_by_uid.pop(p.uid, None)

    async def create_validation_pod(self, name: str, node: str, ep: Episode) -> str | None:
        if name in self.validation_pods:
            return None  # 409: the name is taken
        uid = f"uid-pod-{name}"
        self.validation_pods[name] = ValidationPodFacts(name=name, phase="Succeeded", uid=uid)
        return uid

    async def set_node_label(self, node: str, key: str, value: str | None) -> None:
        n = self.nodes[node]
        labels = {k: v for k, v in n.labels.items() if k != key}
        if value is not None:
            labels[key] = value
        self.nodes[node] = replace(n, labels=labels)

    # Quarantiner: the taint reconciler's part (it applies quarantine_taint at settle())
    def quarantine(self, node: str) -> None:
        self.quarantine_requests[node] += 1

    def apply_quarantine(self) -> None:
        episodes = self.store.episodes()
        for name, n in list(self.nodes.items()):
            want = quarantine_taint([e for e in episodes if not e.replaced], name, KEYS)
            others = tuple(t for t in n.taints if t["key"] != KEYS.quarantine_taint)
            taints = others
            if want is not None:
                taints = (*others, {"key": want.key, "value": want.value, "effect": want.effect})
            if taints != n.taints:
                self.nodes[name] = replace(n, taints=taints)

    # NodeReplacer
    async def replace(self, act: ReplaceNode) -> tuple[ReplaceOutcome, str]:
        ep = next((e for e in self.store.episodes() if e.node == act.node and e.terminal), None)
        r = ep.status.replacement if ep is not None else None
        self.statuses_at_delete.append(r.state if r is not None else "")
        node = self.nodes.get(act.node)
        if node is None:
            return "not-found", f"node {act.node} does not exist"
        if node.uid != act.node_uid:
            return "mismatch", "another Node"
        if act.method == "node":
            if not node.unschedulable:
                return "mismatch", "not cordoned"
            del self.nodes[act.node]
            self.replaced.append(("node", act.node))
        else:
            claim = self.nodeclaims.get(act.node_claim)
            if claim is None:
                return "not-found", f"NodeClaim {act.node_claim} does not exist"
            if claim != (act.node_claim_uid, act.node, act.pool):
                return "mismatch", f"NodeClaim {act.node_claim} is not the node's"
            del self.nodeclaims[act.node_claim]
            self.replaced.append(("nodeclaim", act.node_claim))
        if self.replacer_fails:
            self.replacer_fails -= 1
            raise ConflictError("the answer was lost", 0)
        return "deleted", "deleted"

    def apply_cordon(self) -> None:
        """The reconciler's part: a node drained for its replacement is cordoned."""
        for ep in self.store.episodes():
            n = self.nodes.get(ep.node)
            if n is not None and holds_cordon(ep) and not n.unschedulable:
                self.nodes[ep.node] = replace(n, unschedulable=True)

    # gate
    def request(self, write: HardWrite) -> GateDecision:
        self.gate_requests.append(write)
        if self.gate_open:
            return GateDecision(allowed=True)
        return GateDecision(allowed=False, reason="BreakerOpen", message="breaker open")

    # events
    async def post(self, ep: Episode, note: Note, now: datetime) -> None:
        self.notes.append((ep.name, note.reason))

    # the agent (OrderSender side)
    async def send(self, node: str, order: Order) -> bool:
        if not self.agent.connected:
            return False
        old = self.results.get(order.order_id)
        if old is not None:  # a repeat: the same answer, no second execution
            self.book.record(node, msgspec.structs.replace(old, seq=next(self.seq)))
            return True
        self.executed[order.order_id] += 1
        report = self._execute(node, order)
        self.results[order.order_id] = report
        self.book.record(node, report)
        return True

    def _report(self, node: str, order: Order, state: str, **kw: object) -> ActionReport:
        return ActionReport(
            seq=next(self.seq),
            node=node,
            order_id=order.order_id,
            episode=order.episode,
            action=ORDER_KINDS[type(order)],
            state=state,  # type: ignore[arg-type]
            at=self.clock.now(),
            boot_id=self.nodes[node].boot_id,
            **kw,  # type: ignore[arg-type]
        )

    def _execute(self, node: str, order: Order) -> ActionReport:
        n = self.nodes[node]
        if isinstance(order, ResetGpuOrder):
            if self.agent.reset == "refused":
                return self._report(node, order, "refused", reason="gpu-busy")
            if self.agent.reset == "failed":
                return self._report(node, order, "failed", reason="command-failed")
            self.clear_verdicts(node, set(order.gpus))
            return self._report(node, order, "succeeded")
        if isinstance(order, RebootOrder):
            if order.expected_boot_id != n.boot_id:
                return self._report(node, order, "refused", reason="boot-id-changed")
            if self.agent.reboot:
                self.pending_reboots.add(node)
            return self._report(node, order, "accepted")
        if isinstance(order, ValidateOrder):
            if self.agent.validate == "never":
                return self._report(node, order, "running")
            ok = self.agent.validate == "succeeded"
            checks = [CheckResult(name="soak", passed=ok)]
            return self._report(node, order, "succeeded" if ok else "failed", checks=checks)
        return self._report(node, order, "succeeded")

    def clear_verdicts(self, node: str, uuids: set[str] | None = None) -> None:
        n = self.nodes[node]
        gpus = tuple(
            replace(g, state="healthy", conditions=()) if uuids is None or g.uuid in uuids else g
            for g in n.gpus
        )
        self.nodes[node] = replace(n, gpus=gpus)

    def settle(self) -> None:
        """Evicted pods finish terminating; a node ordered to reboot comes back with a new
        boot id and no verdicts (latched verdicts belong to the old boot); the taint
        reconciler applies the episodes' quarantine."""
        self.apply_quarantine()
        self.apply_cordon()
        for uid, p in list(self.pods_by_uid.items()):
            if p.deletion_timestamp is not None:
                del self.pods_by_uid[uid]
        for node in sorted(self.pending_reboots):
            n = self.nodes[node]
            self.nodes[node] = replace(n, boot_id=n.boot_id + "+1")
            self.clear_verdicts(node)
        self.pending_reboots.clear()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def later(self, seconds: float) -> datetime:
        return self.clock.now() + timedelta(seconds=seconds)
