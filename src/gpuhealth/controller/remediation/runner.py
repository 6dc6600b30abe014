"""The remediation runner: one pass per episode = observe, step, gate, act, write status.

Level-triggered and stateless between passes: an episode is re-examined when its object
changes, its node's verdict changes, its agent reports, when the step asked for it
(``requeue_after_s``), and every ``resync_s``. Each pass:

1. gathers the observations (:func:`observe`: the only reads a pass makes; pods only where a
   decision needs them: while Draining and for a dry-run's preview);
2. runs the pure :func:`machine.step`;
3. asks the hard-write gate for every kind of disruptive action in the step, once per node
   it lands on (evictions of gang members charge their own nodes); one refusal drops the
   whole step (the episode stays where it was, saying ``BreakerOpen``);
4. before a round of evictions, writes the status ahead (the round's pods counted as
   evicted, its frozen gangs and touched nodes: ``outcomes.reserve_evictions``), so that a
   status write lost after the evictions never lets the blast-radius caps count low;
5. carries the actions out (each is idempotent: evictions of pods already gone answer 404,
   orders carry ids derived from the status);
6. writes the status through the status subresource, guarded by the resourceVersion (a
   409 re-runs the pass), then posts the Events and observes the metrics.

A crash between 5 and 6 repeats 2-5 on the next pass with the same result (an eviction
round's count and gangs are already stored). Only the leader
runs it; ``write_nothing`` (the controller's global dry-run) logs the steps instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import GpuHealthError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.names import (
    CONTROLLER,
    EVENT_CIRCUIT_BREAKER_OPEN,
    EXCLUDE_VALUE,
    MANAGED_BY_LABEL,
    OPT_OUT_VALUE,
    Keys,
)
from gpuhealth.controller.remediation import machine
from gpuhealth.controller.remediation.actions import (
    CreateValidationPod,
    Evict,
    ForceDelete,
    Quarantine,
    ReplaceNode,
    SendOrder,
    SetNodeLabel,
    hard_writes,
)
from gpuhealth.controller.remediation.drain import gangs_in_scope
from gpuhealth.controller.remediation.facts import (
    EpisodeAdmission,
    Observed,
    PdbFacts,
    PodFacts,
    ValidationPodFacts,
    unique_pods,
)
from gpuhealth.controller.remediation.fault import expired, propose
from gpuhealth.controller.remediation.metrics import RemediationMetrics
from gpuhealth.controller.remediation.model import Episode, Phase, Status
from gpuhealth.controller.remediation.outcomes import (
    EvictionResult,
    blocked,
    record_delivery,
    record_error,
    record_evictions,
    record_replacement,
    record_validation_pod,
    replacement_blocked,
    reserve_evictions,
)
from gpuhealth.controller.remediation.ports import (
    BreakerRoomReader,
    Disruptor,
    EpisodeStore,
    KubeEventSink,
    NodeFactsReader,
    NodeReplacer,
    OrderSender,
    PodReader,
    Quarantiner,
    ReportReader,
)
from gpuhealth.controller.remediation.replacing import node_scoped, replacing_drain
from gpuhealth.controller.remediation.safety import (
    HardWriteGate,
    admission,
    approval_required,
    capability_gap,
    hold_reason,
)
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.controller.remediation.status import held_reason
from gpuhealth.controller.remediation.step import Context, Note, Step
from gpuhealth.controller.workqueue import WorkQueue, run_worker

log = get_logger("remediation")

EPISODE = "episode/"
NODE = "node/"
LABEL_MAX = 63
REPLACEMENT_RESULTS = {
    "Skipped": "skipped",
    "Deleted": "requested",
    "Failed": "failed",
    "Completed": "completed",
}
"""``gpuhealth_remediation_replacements_total{result}`` of each state a replacement reaches."""


class NoReplacerError(GpuHealthError):
    """A replacement was asked for, and the runner was built without a node replacer."""


@dataclass
class Ports:
    store: EpisodeStore
    nodes: NodeFactsReader
    pods: PodReader
    disruptor: Disruptor
    orders: OrderSender
    reports: ReportReader
    quarantiner: Quarantiner
    gate: HardWriteGate
    events: KubeEventSink
    replacer: NodeReplacer | None = None
    """Deletes an escalated node's NodeClaim or Node (``remediation.replace``)."""
    room: BreakerRoomReader | None = None
    """The breaker's room, for a drain to check before its first eviction (None: the gate
    alone decides, node by node)."""


@dataclass(frozen=True, slots=True)
class ShardCaps:
    """Past one process, the remediation loop's fleet-wide limits as one shard owner sees
    them: ``part`` of a cap (split by the shards' GPU nodes: the parts add up to the cap),
    and ``every_episode`` in the cluster (the escalation guard counts them all)."""

    part: Callable[[int], int]
    every_episode: Callable[[], Sequence[Episode]]


class RemediationRunner:
    def __init__(
        self,
        settings: RemediationSettings,
        keys: Keys,
        ports: Ports,
        metrics: RemediationMetrics,
        clock: Clock,
        *,
        write_nothing: bool = False,
    ) -> None:
        self.held: Callable[[str], str | None] = lambda _node: None
        """The open NVLink domain incident ``node`` belongs to
        (``gpuhealth.controller.incidents.domain_monitor``): no new episode starts there."""
        self.owns: Callable[[str], bool] = lambda _node: True
        """Past one process: whether this replica owns the node's shard now. The episodes of
        other shards' nodes are their owners': never stepped, counted or collected here."""
        self.shards: ShardCaps | None = None
        """Past one process: this owner's part of the fleet's concurrency cap, and every
        episode (the escalation guard's)."""
        self.settings = settings
        self.keys = keys
        self.p = ports
        self.metrics = metrics
        self.clock = clock
        self.write_nothing = write_nothing
        self.queue = WorkQueue(clock, backoff_base_s=0.5, backoff_max_s=60.0, name="remediation")

    # -- triggers (wired by the controller) -------------------------------------------------

    def enqueue(self, episode: str) -> None:
        self.queue.add(EPISODE + episode)

    def node_changed(self, node: str) -> None:
        """A node's verdict, boot id or labels changed: maybe a new episode, and a pass for
        its current ones."""
        self.queue.add(NODE + node)
        for ep in self._episodes():
            if ep.node == node:
                self.enqueue(ep.name)

    # -- one pass ---------------------------------------------------------------------------

    def _episodes(self) -> list[Episode]:
        """The episodes of the nodes this replica owns (every episode with one process)."""
        return [e for e in self.p.store.episodes() if self.owns(e.node)]

    def _history(self, node: str, besides: str = "") -> tuple[Episode, ...]:
        return tuple(e for e in self.p.store.episodes() if e.node == node and e.name != besides)

    async def consider(self, node: str) -> str | None:
        """Create the episode for a new fault on ``node``; returns its name. A node of an
        NVLink domain with an open incident starts none (:attr:`held`): the shared fabric is
        the operator's decision, not a per-node reset's."""
        facts = self.p.nodes.node(node)
        if facts is None or not self.settings.enabled or not self.owns(node):
            return None
        if (incident := self.held(node)) is not None:
            log.info("remediation_held_by_domain_incident", node=node, incident=incident)
            return None
        prop = propose(facts, self._history(node), self.settings, self.keys, self.clock.now())
        if prop.spec is None:
            return None
        if self.write_nothing:
            log.info(
                "remediation_would_start", node=node, episode=prop.name, action=prop.spec.action
            )
            return None
        labels = {MANAGED_BY_LABEL: CONTROLLER}
        if len(node) <= LABEL_MAX:
            labels[self.keys.node_label] = node
        created = await self.p.store.create(prop.name, prop.spec, labels)
        if created is not None:
            self.metrics.started.labels(prop.spec.action).inc()
            log.info("remediation_started", node=node, episode=prop.name, action=prop.spec.action)
        self.enqueue(prop.name)
        return prop.name

    async def reconcile(self, name: str) -> float | None:
        """One pass over one episode; returns when to look again (None: on change only)."""
        ep = self.p.store.get(name)
        if ep is None or not self.owns(ep.node):
            return None
        now = self.clock.now()
        obs = await observe(
            ep,
            now=now,
            episodes=self._episodes(),
            nodes=self.p.nodes,
            pods=self.p.pods,
            reports=self.p.reports,
            settings=self.settings,
            keys=self.keys,
            room=self.p.room,
            shards=self.shards,
        )
        cx = Context(self.settings, self.keys, self._history(ep.node, besides=ep.name))
        step = self._gate(ep, machine.step(ep, obs, cx))
        if self.write_nothing:
            if step.actions or step.transitions:
                log.info(
                    "remediation_planned",
                    episode=name,
                    phase=step.status.phase.value,
                    actions=[type(a).__name__ for a in step.actions],
                )
            return step.requeue_after_s
        before = ep.status
        evictions = [a.eviction for a in step.actions if isinstance(a, Evict)]
        if evictions:  # written ahead: a lost write after the evictions never undercounts
            ahead = reserve_evictions(step.status, evictions, now)
            ep = await self.p.store.write_status(ep, ahead)
            step = dataclasses.replace(step, status=ahead)
        if any(isinstance(a, ReplaceNode) for a in step.actions) and step.status != ep.status:
            # written ahead: a crash after the delete finds it Requested, and sends it again
            ep = await self.p.store.write_status(ep, step.status)
        status, notes = await self._act(ep, step)
        self._count_hold(before, status)
        self._count_replacement(before, status)
        if status != ep.status:
            ep_after = await self.p.store.write_status(ep, status)
        else:
            ep_after = ep
        for frm, to in step.transitions:
            self.metrics.transition(ep_after, frm, to)
            log.info(
                "remediation_phase",
                episode=name,
                node=ep.node,
                phase=to.value,
                previous=frm.value,
                reason=status.reason,
            )
        if ep.status.times.returned is None and status.times.returned is not None:
            self.metrics.returned(ep_after)
        for note in (*step.notes, *notes):
            await self._post(ep_after, note)
        return step.requeue_after_s

    def _gate(self, ep: Episode, step: Step) -> Step:
        """Every node a disruptive action lands on asks the gate (its own node first, then
        the other nodes of evicted gang members), before any action is carried out."""
        for write in hard_writes(ep, step.actions):
            decision = self.p.gate.request(write)
            if decision.allowed:
                continue
            self.metrics.gate_blocked.labels(write.kind).inc()
            log.warning(
                "remediation_gate_blocked",
                episode=ep.name,
                node=write.node,
                kind=write.kind,
                reason=decision.reason,
            )
            notes: tuple[Note, ...] = ()
            if decision.tripped:
                notes = (Note("Warning", EVENT_CIRCUIT_BREAKER_OPEN, decision.message, node=True),)
            refused = replacement_blocked if ep.terminal else blocked
            return Step(
                refused(ep.status, write, decision, self.clock.now()),
                notes=notes,
                requeue_after_s=self.settings.resync_s,
            )
        return step

    def _count_hold(self, before: Status, after: Status) -> None:
        reason = held_reason(after)
        if reason and reason != held_reason(before):
            self.metrics.holds.labels(reason).inc()
        owner = after.managed_repair
        if owner is not None and owner != before.managed_repair:
            self.metrics.managed_repairs.labels(owner.owner).inc()

    def _count_replacement(self, before: Status, after: Status) -> None:
        r = after.replacement
        was = before.replacement.state if before.replacement is not None else None
        result = REPLACEMENT_RESULTS.get(r.state) if r is not None else None
        if r is not None and result is not None and r.state != was:
            self.metrics.replacements.labels(r.method or "none", result).inc()

    async def _act(self, ep: Episode, step: Step) -> tuple[Status, list[Note]]:
        st = step.status
        notes: list[Note] = []
        evictions: list[EvictionResult] = []
        for act in step.actions:
            try:
                if isinstance(act, Quarantine):
                    self.p.quarantiner.quarantine(act.node)
                elif isinstance(act, Evict):
                    e = act.eviction
                    outcome, message = await self.p.disruptor.evict(e.pod, e.grace_period_s)
                    self.metrics.evictions.labels(outcome).inc()
                    evictions.append(EvictionResult(e.pod, e.gang, outcome, message))
                elif isinstance(act, ForceDelete):
                    await self.p.disruptor.force_delete(act.pod)
                    log.warning(
                        "remediation_force_deleted",
                        episode=ep.name,
                        pod=act.pod.name,
                        namespace=act.pod.namespace,
                    )
                elif isinstance(act, SendOrder):
                    ok = await self.p.orders.send(ep.node, act.order)
                    self.metrics.orders.labels(act.kind, "delivered" if ok else "undelivered").inc()
                    st = record_delivery(st, act.order.order_id, ok)
                elif isinstance(act, CreateValidationPod):
                    uid = await self.p.disruptor.create_validation_pod(act.name, act.node, ep)
                    st = record_validation_pod(st, act.name, uid)
                elif isinstance(act, SetNodeLabel):
                    await self.p.disruptor.set_node_label(act.node, act.key, act.value)
                elif isinstance(act, ReplaceNode):
                    if self.p.replacer is None:
                        raise NoReplacerError(f"no node replacer to replace {act.node}")
                    done, said = await self.p.replacer.replace(act)
                    st, note = record_replacement(st, act, done, said, self.clock.now())
                    notes.append(note)
                    log.warning(
                        "remediation_replacement",
                        episode=ep.name,
                        node=act.node,
                        method=act.method,
                        outcome=done,
                        message=said,
                    )
            except GpuHealthError as exc:
                log.warning(
                    "remediation_action_failed",
                    episode=ep.name,
                    action=type(act).__name__,
                    error=str(exc),
                )
                st = record_error(st, type(act).__name__, str(exc))
        if evictions:
            st = record_evictions(st, evictions, self.clock.now())
        return st, notes

    async def _post(self, ep: Episode, note: Note) -> None:
        try:
            await self.p.events.post(ep, note, self.clock.now())
        except GpuHealthError as exc:
            log.warning(
                "remediation_event_failed", episode=ep.name, reason=note.reason, error=str(exc)
            )

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Workers and the resync, until cancelled (leader only)."""
        self.resync()
        async with asyncio.TaskGroup() as tg:
            for i in range(self.settings.workers):
                tg.create_task(
                    run_worker(
                        self.queue,
                        self.handle,
                        failure_event="remediation_pass_failed",
                        key_field="key",
                    ),
                    name=f"remediation-worker-{i}",
                )
            tg.create_task(self._resync_loop(), name="remediation-resync")

    def resync(self) -> None:
        """Every episode, and every node with an unhealthy GPU (a new leader finds the faults
        that arrived before it led)."""
        for ep in self.p.store.episodes():
            self.enqueue(ep.name)
        for node in self.p.nodes.candidates():
            self.queue.add(NODE + node)

    async def _resync_loop(self) -> None:
        while True:
            await self.clock.sleep(self.settings.resync_s)
            self.resync()
            await self.collect_garbage()

    async def collect_garbage(self) -> int:
        if self.write_nothing:
            return 0
        old = expired(self._episodes(), self.clock.now(), self.settings.safety.history_s)
        for ep in old:
            try:
                await self.p.store.delete(ep.name)
            except GpuHealthError as exc:
                log.warning("remediation_gc_failed", episode=ep.name, error=str(exc))
        return len(old)

    async def handle(self, key: str) -> bool:
        """One queue key: ``node/<name>`` considers a new episode, ``episode/<name>`` runs a
        pass and requeues it when the step asked to be looked at again."""
        try:
            if key.startswith(NODE):
                await self.consider(key.removeprefix(NODE))
                return True
            delay = await self.reconcile(key.removeprefix(EPISODE))
        except Exception:
            self.metrics.errors.inc()
            raise
        if delay is not None:
            self.queue.add_after(key, delay)
        return True

    def idle(self) -> bool:
        return len(self.queue) == 0 and self.queue.processing == 0


__all__ = ["EPISODE", "NODE", "Phase", "Ports", "RemediationRunner"]


async def observe(
    ep: Episode,
    *,
    now: datetime,
    episodes: Sequence[Episode],
    nodes: NodeFactsReader,
    pods: PodReader,
    reports: ReportReader,
    settings: RemediationSettings,
    keys: Keys,
    room: BreakerRoomReader | None = None,
    shards: ShardCaps | None = None,
) -> Observed:
    node = nodes.node(ep.node)
    if node is None:
        return Observed(now=now, node=None)
    dry = settings.dry_run or ep.spec.dry_run
    on_node: list[PodFacts] = []
    elsewhere: list[PodFacts] = []
    pdbs: list[PdbFacts] = []
    replacing = replacing_drain(ep)
    if ep.phase is Phase.DRAINING or (ep.phase is Phase.PENDING and dry) or replacing:
        on_node = await pods.pods_on_node(ep.node)
        gangs = gangs_in_scope(
            node_scoped(ep.spec) if replacing else ep.spec,
            node,
            on_node,
            settings.drain,
            frozen=ep.status.frozen_gangs,
        )
        for gang in gangs:
            elsewhere += await pods.gang_members(gang)
        known = {p.uid for p in (*on_node, *elsewhere)}
        for rec in ep.status.waiting_pods:
            if rec.uid and rec.uid not in known:
                pod = await pods.pod(rec.namespace, rec.name)
                if pod is not None and pod.uid == rec.uid:
                    elsewhere.append(pod)
        for namespace in sorted({g.namespace for g in gangs}):
            pdbs += await pods.pdbs(namespace)
    order = ep.status.order
    report = reports.latest(ep.node, order.id) if order is not None else None
    vpod: ValidationPodFacts | None = None
    validation = ep.status.validation
    pod_cfg = settings.validation.pod
    if (
        ep.phase is Phase.VALIDATING
        and pod_cfg is not None
        and validation is not None
        and validation.pod_name
    ):
        vpod = await pods.validation_pod(pod_cfg.namespace, validation.pod_name)
    admit = EpisodeAdmission(allowed=True)
    if ep.phase is Phase.PENDING:
        admit = admission(
            ep,
            episodes,
            gpu_nodes=nodes.gpu_nodes(),
            settings=settings,
            keys=keys,
            held=_held(nodes, settings, keys),
            pool_of=nodes.pool,
            pool_nodes=nodes.pool_nodes,
            every_episode=shards.every_episode() if shards is not None else None,
            part=shards.part(settings.safety.max_concurrent) if shards is not None else None,
        )
    return Observed(
        now=now,
        node=node,
        pods=tuple(on_node),
        gang_pods=tuple(unique_pods(elsewhere)),
        off_limits=_off_limits({p.node for p in elsewhere} - {ep.node}, nodes, keys),
        pdbs=tuple(pdbs),
        report=report,
        validation_pod=vpod,
        admission=admit,
        breaker=(
            room.room({ep.node, *(p.node for p in elsewhere if p.node)})
            if room is not None and ep.phase is Phase.DRAINING
            else None
        ),
    )


def _off_limits(names: set[str], nodes: NodeFactsReader, keys: Keys) -> dict[str, str]:
    """Other nodes of gang members an operator keeps the loop off (opt-out or exclude)."""
    out: dict[str, str] = {}
    for name in sorted(n for n in names if n):
        facts = nodes.node(name)
        labels = facts.labels if facts is not None else {}
        if labels.get(keys.opt_out_label) == OPT_OUT_VALUE:
            out[name] = f"{keys.opt_out_label}={OPT_OUT_VALUE}"
        elif labels.get(keys.exclude_label) == EXCLUDE_VALUE:
            out[name] = f"{keys.exclude_label}={EXCLUDE_VALUE}"
    return out


def _held(
    nodes: NodeFactsReader, settings: RemediationSettings, keys: Keys
) -> Callable[[Episode], bool]:
    def held(ep: Episode) -> bool:
        """Not in the admission queue: an operator's hold, or a reboot not yet approved
        (waiting for an approval takes no one's turn)."""
        node = nodes.node(ep.node)
        if approval_required(ep, settings) and not ep.annotations.get(keys.approve_annotation):
            return True
        if node is None or capability_gap(ep, node, settings) is not None:
            return True
        return hold_reason(ep, node, settings, keys) is not None

    return held
