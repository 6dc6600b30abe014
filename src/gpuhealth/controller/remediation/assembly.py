"""The remediation loop's production parts and how they hang together, built once by
``gpuhealth.controller.compose.build_controller`` (docs/remediation.md, docs/architecture.md).

- :func:`build_episodes`: what every replica keeps: the GPURemediation watch cache (the
  status CLI, the status page and the metrics read it) and the agents' action reports (the
  stream records them on whichever replica the agent talks to).
- :func:`build_runner`: the leader's work: the runner over its ports (the fleet and the node
  cache, the pod and eviction API, the agents' stream for orders, the taint reconciler for the
  quarantine, Events) and the triggers that make it look at an episode again.
- :func:`hold_for`: the reconciler's view of the episodes (the quarantine taint a node
  must carry, the autoscalers' annotations and the cordon while they hold it): the reconciler
  stays the only writer of taints and of the Node's spec. The episodes are read whatever
  ``remediation.enabled`` says (read-only when the loop is off), so turning the loop off
  never releases a quarantined or escalated node, and until the store has synced the
  reconciler keeps a node's quarantine taint, annotations and cordon as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import Clock
from gpuhealth.controller.breaker.gate import WriteGate
from gpuhealth.controller.fleet.model import ChangeKind, Fleet
from gpuhealth.controller.kube.node_cache import Change, NodeCache
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.leadership.work import NamedTask
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.action_reports import ReportBook
from gpuhealth.controller.remediation.episode_store import GPURemediationStore
from gpuhealth.controller.remediation.facts import BreakerRoom
from gpuhealth.controller.remediation.kube_events import RemediationKubeEvents
from gpuhealth.controller.remediation.managed_repair import repair_owner
from gpuhealth.controller.remediation.metrics import RemediationCollector, RemediationMetrics
from gpuhealth.controller.remediation.node_reader import FleetNodeReader, Pools
from gpuhealth.controller.remediation.pods import RemediationPods
from gpuhealth.controller.remediation.replacer import KubeNodeReplacer
from gpuhealth.controller.remediation.replacing import holds_cordon
from gpuhealth.controller.remediation.runner import Ports, RemediationRunner, ShardCaps
from gpuhealth.controller.remediation.settings import ManagedRepairSettings, RemediationSettings
from gpuhealth.controller.remediation.taint import current_quarantine, quarantine_taint
from gpuhealth.controller.taints.policy import KEEP, Hold, Taint
from gpuhealth.protocol.remediation import ActionReport, Order

HEALTH_CHANGES: frozenset[ChangeKind] = frozenset({"health", "connection", "removed"})
"""Fleet changes that may start, advance or end an episode (a verdict, a new boot id)."""


@dataclass(frozen=True, slots=True)
class Episodes:
    """What every replica keeps of the loop."""

    keys: Keys
    store: GPURemediationStore
    reports: ReportBook

    def record_report(self, node: str, report: ActionReport) -> None:
        self.reports.record(node, report)


def build_episodes(
    api: ApiClient,
    keys: Keys,
    watch: WatchSettings,
    *,
    timeout_s: float,
    registry: CollectorRegistry,
    clock: Clock,
) -> Episodes:
    """Built whether the loop is on or off: stored episodes keep their quarantine either way
    (with the loop off they are only read; without the CRD there are none)."""
    store = GPURemediationStore(api, watch, timeout_s=timeout_s, clock=clock)
    registry.register(RemediationCollector(store.episodes, clock.now, lambda: store.invalid))
    return Episodes(keys, store, ReportBook())


def replica_tasks_of(episodes: Episodes) -> list[NamedTask]:
    """Every replica watches the episodes (the reconciler, the status CLI, page and metrics
    read them), with the loop on or off."""
    return [NamedTask("remediation-episodes", episodes.store.run)]


def hold_for(
    episodes: Episodes, managed: ManagedRepairSettings
) -> Callable[[NodeView], Hold | None]:
    """What the episodes hold on a node now (for the reconciler's desired node): the
    quarantine taint, the autoscalers' annotations while they hold it (not on a node a managed
    repairer owns: gpuhealth does not stand in its way), the cordon while the node is drained
    for its replacement. Before the episode store has synced the answer is the node as it is
    (its own quarantine taint, the annotations and cordon gpuhealth set): the reconciler
    neither adds nor removes anything on a guess."""
    keys = episodes.keys

    def hold(view: NodeView) -> Hold | None:
        if not episodes.store.synced.is_set():
            current = current_quarantine(view.taints, keys)
            return dataclasses.replace(KEEP, taint=current)
        mine = [ep for ep in episodes.store.episodes() if ep.node == view.name]
        q = quarantine_taint(mine, view.name, keys)
        cordon = any(
            holds_cordon(ep)
            and ep.status.replacement is not None
            and ep.status.replacement.node_uid in ("", view.uid)
            for ep in mine
        )
        if q is None and not cordon:
            return None
        owned = repair_owner(view.labels, view.conditions, managed) is not None
        taint = None if q is None else Taint(q.key, q.value, q.effect)
        return Hold(taint, guard=q is not None and not owned, cordon=cordon)

    return hold


def follow_episodes(episodes: Episodes, requeue_node: Callable[[str], None]) -> None:
    """The taint reconciler looks at a node again when one of its episodes changes (its
    quarantine follows the episode's phase), the loop on or off."""
    nodes_of: dict[str, str] = {}

    def episode_changed(name: str) -> None:
        ep = episodes.store.get(name)
        node = ep.node if ep is not None else nodes_of.pop(name, None)
        if ep is not None:
            nodes_of[name] = ep.node
        if node is not None:
            requeue_node(node)

    episodes.store.subscribe(episode_changed)


class GateRoom:
    """The runner's ``BreakerRoomReader`` over the controller's gate: the breaker's window and
    limit read as they are, nothing counted (asking the gate would count, and a refusal
    would open the breaker)."""

    def __init__(self, gate: WriteGate) -> None:
        self._gate = gate

    def room(self, nodes: Iterable[str]) -> BreakerRoom:
        breaker = self._gate.breaker
        if not breaker.settings.enabled:
            return BreakerRoom()
        admitted = frozenset(node for node, _at in breaker.window())
        free = 0 if breaker.is_open else breaker.limit(self._gate.gpu_nodes()) - len(admitted)
        pool_of = {
            node: pool
            for node in nodes
            if breaker.budgeted(pool := self._gate.pool_of(node)) and pool not in breaker.open_pools
        }
        pool_free = {
            pool: max(
                0,
                breaker.pool_limit(pool, self._gate.pool_nodes(pool)) - breaker.pool_admitted(pool),
            )
            for pool in set(pool_of.values())
        }
        return BreakerRoom(
            admitted=admitted,
            free=max(0, free),
            open=breaker.is_open,
            pool_of=pool_of,
            pool_free=pool_free,
        )


class _TaintWriter:
    """The runner's ``Quarantiner``: the reconciler looks at the node again (it reads the
    quarantine from the episodes through :func:`hold_for`)."""

    def __init__(self, enqueue: Callable[[str], None]) -> None:
        self._enqueue = enqueue

    def quarantine(self, node: str) -> None:
        self._enqueue(node)


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """What the runner takes from the controller's configuration besides its own section."""

    settings: RemediationSettings
    """``remediation:``."""
    gpu_resource: str
    own_namespace: str
    """The controller's namespace, where gpuhealth's own pods are recognised."""
    events_namespace: str
    timeout_s: float
    """Deadline of one API request."""
    dry_run: bool
    """The controller's ``dry_run``: nothing is written."""


@dataclass(frozen=True, slots=True)
class RunnerDeps:
    """The parts of the controller the runner works through."""

    fleet: Fleet
    cache: NodeCache
    stream: OrderStream
    gate: WriteGate
    requeue_node: Callable[[str], None]
    """The taint reconciler's ``enqueue``."""
    clock: Clock
    pools: Pools | None = None
    """Each node's pool and the GPU nodes per pool (the per-pool caps)."""
    acknowledged: Callable[[str], frozenset[Taint]] = lambda _node: frozenset()
    """A node's taints of ours removed by hand (the reconciler's acknowledgements)."""
    owns: Callable[[str], bool] = lambda _node: True
    """Past one process: whether this replica owns the node's shard now (the runner's
    ``owns``)."""
    caps: ShardCaps | None = None
    """Past one process: this owner's part of the fleet's caps (the runner's ``shards``)."""


def build_runner(
    options: RunnerOptions,
    api: ApiClient,
    episodes: Episodes,
    deps: RunnerDeps,
    registry: CollectorRegistry,
) -> RemediationRunner:
    """The runner for ``remediation:``; nothing is written in the global ``dry_run``."""
    settings = options.settings
    timeout_s = options.timeout_s
    clock = deps.clock
    keys = episodes.keys
    ports = Ports(
        store=episodes.store,
        nodes=FleetNodeReader(deps.fleet, deps.cache, deps.pools, deps.acknowledged),
        pods=(
            pods := RemediationPods(
                api,
                keys,
                gpu_resource=options.gpu_resource,
                validation=settings.validation.pod,
                timeout_s=timeout_s,
                own_namespace=options.own_namespace,
            )
        ),
        disruptor=pods,
        orders=StreamOrders(deps.stream, clock),
        reports=episodes.reports,
        quarantiner=_TaintWriter(deps.requeue_node),
        gate=deps.gate,
        events=RemediationKubeEvents(
            api, events_namespace=options.events_namespace, timeout_s=timeout_s
        ),
        replacer=KubeNodeReplacer(api, timeout_s=timeout_s) if settings.replace.enabled else None,
        room=GateRoom(deps.gate),
    )
    runner = RemediationRunner(
        settings, keys, ports, RemediationMetrics(registry), clock, write_nothing=options.dry_run
    )
    runner.held = deps.gate.holding  # NVLink domain incidents
    runner.owns = deps.owns
    runner.shards = deps.caps
    _subscribe(runner, episodes, deps)
    return runner


def _subscribe(runner: RemediationRunner, episodes: Episodes, deps: RunnerDeps) -> None:
    """What makes the runner look again (:func:`follow_episodes` requeues the node for the
    taint reconciler)."""

    def episode_changed(name: str) -> None:
        if episodes.store.get(name) is not None:
            runner.enqueue(name)

    def fleet_changed(node: str, kind: ChangeKind) -> None:
        if kind in HEALTH_CHANGES:
            runner.node_changed(node)

    def node_changed(change: Change, old: NodeView | None, new: NodeView | None) -> None:
        if old is None or new is None or old.taints != new.taints or old.labels != new.labels:
            runner.node_changed((new or old).name)  # type: ignore[union-attr]

    episodes.store.subscribe(episode_changed)
    episodes.reports.listener = lambda node, _report: runner.node_changed(node)
    deps.fleet.subscribe(fleet_changed)
    deps.cache.subscribe(node_changed)
    deps.gate.subscribe(on_reset=lambda _blocked: runner.resync())


def remediation_task(
    options: RunnerOptions,
    api: ApiClient,
    episodes: Episodes,
    deps: RunnerDeps,
    registry: CollectorRegistry,
) -> NamedTask | None:
    """The leader's remediation work: once the episode cache is synced, the runner (None
    while ``remediation.enabled`` is false). Either way the taint reconciler follows the
    episodes (:func:`follow_episodes`)."""
    follow_episodes(episodes, deps.requeue_node)
    if not options.settings.enabled:
        return None
    runner = build_runner(options, api, episodes, deps, registry)

    async def run() -> None:
        await episodes.store.synced.wait()
        await runner.run()

    return NamedTask("remediation", run)


class OrderStream(Protocol):
    """The agents' stream (:class:`gpuhealth.controller.stream.server.StreamServer`)."""

    async def send_order(self, node: str, make: Callable[[int], Order]) -> bool: ...


class StreamOrders:
    """The runner's ``OrderSender`` over the agents' stream: the order goes to the node's live
    connection on this replica (agents talk to the leader), ``seq`` counted there."""

    def __init__(self, stream: OrderStream, clock: Clock) -> None:
        self._stream = stream
        self._clock = clock

    async def send(self, node: str, order: Order) -> bool:
        now = self._clock.now()
        return await self._stream.send_order(
            node, lambda seq: msgspec.structs.replace(order, seq=seq, issued_at=now)
        )
