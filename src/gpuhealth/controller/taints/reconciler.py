"""Level-triggered reconciler: desired facts (policy over the fleet model) versus the Node as
the watch cache has it; one guarded merge patch per node per pass.

Three queues, each keyed by node and deduplicated:
- the node queue (``workers`` concurrent): taints, labels, our annotations — the facts that
  keep pods away, written first;
- the status queue (``status_workers``): the ``GPUHealthy`` condition through nodes/status;
- the event queue (bounded, best effort): Events never hold up a taint.

A 409 re-reads the node and re-plans at once (``conflict_retries`` times); other errors
requeue the node with exponential backoff. Nothing is written in dry-run mode.

Hand removals: while :attr:`Reconciler.detects_overrides` says so (the leader, once it adopted
the incidents), a node watch event that shows a taint of ours gone which the plan keeps, not
removed by this controller (its writes in flight, and the node's last taint writer per its
managedFields), is handed to the :class:`Acknowledgements` (the override incidents,
``gpuhealth.controller.incidents.overrides``): the plan does not put it back until the
override ends. The annotations earlier versions read for that decide nothing: a node carrying
``<prefix>/acknowledged-taints`` gets the ``OverrideIgnored`` Warning Event (once per node per
controller start, as for an old override label) naming the new mechanism.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.gate import HardWrite, HardWriteKind, WriteGate
from gpuhealth.controller.fleet.model import ChangeKind, Fleet
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.kube.node_cache import Change, NodeCache
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.kube.rest import ConflictError, NotFoundError
from gpuhealth.controller.metrics import ControllerMetrics
from gpuhealth.controller.names import (
    CONTROLLER,
    DISRUPTION_GUARDS,
    EVENT_CIRCUIT_BREAKER_OPEN,
    EVENT_OVERRIDE_IGNORED,
    EXCLUDE_VALUE,
    Keys,
)
from gpuhealth.controller.taints.node_api import NodeApi
from gpuhealth.controller.taints.plan import NodePlan, condition_body, hand_removed, plan_node
from gpuhealth.controller.taints.policy import DesiredNode, DeviceVerdict, Hold, Taint, desired_node
from gpuhealth.controller.taints.settings import PolicySettings, ReconcilerSettings
from gpuhealth.controller.workqueue import WorkQueue, run_worker

log = get_logger("reconciler")


class DeviceTainter(Protocol):
    def want(self, node: str, devices: tuple[DeviceVerdict, ...], authoritative: bool) -> None: ...

    def forget(self, node: str) -> None: ...


class Acknowledgements(Protocol):
    """Taints of ours removed by hand, in state the controller owns (the override
    incidents: ``gpuhealth.controller.incidents.overrides.TaintOverrides``)."""

    def of(self, node: str) -> frozenset[Taint]:
        """The node's acknowledged taints: not put back."""

    def removed_by_hand(self, node: str, taints: frozenset[Taint], by: str) -> None:
        """Someone (``by``: the field manager, best effort) removed ``taints`` by hand."""

    def settled(self, node: str, taints: frozenset[Taint], why: str) -> None:
        """Those acknowledgements end (the verdict changed, the node recovered or went)."""


def _hard(plan: NodePlan) -> str:
    return ",".join(t.render() for t in plan.added if t.hard)


def relevant_change(keys: Keys, old: NodeView | None, new: NodeView | None) -> bool:
    """Does a watch event touch anything the reconciler owns or reads?"""
    if old is None or new is None:
        return True
    if old.taints != new.taints or old.condition != new.condition:
        return True
    if old.unschedulable != new.unschedulable or old.conditions != new.conditions:
        return True
    for label in (keys.exclude_label, *keys.moved_override_labels()):
        if old.labels.get(label) != new.labels.get(label):
            return True
    for key in (
        keys.acknowledged_annotation,  # its Warning Event
        keys.guards_annotation,
        *DISRUPTION_GUARDS,
    ):
        if old.annotations.get(key) != new.annotations.get(key):
            return True
    return any(
        old.labels.get(k) != new.labels.get(k) for k in (keys.state_label, keys.healthy_gpus_label)
    )


def ignored_overrides(
    keys: Keys, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> str | None:
    """The Warning for a Node carrying an old override (a node's own kubelet may set it, so it
    is ignored), naming what replaced it: an old override label, or the old acknowledgement
    annotation of hand-removed taints (override incidents now); None without one."""
    moved = [(old, new) for old, new in keys.moved_override_labels().items() if old in labels]
    said = [
        f"label {old}={labels[old]} is ignored (the node's own kubelet may set it): "
        f"an operator sets {new} instead (docs/operations.md, Opting a node out)"
        for old, new in moved
    ]
    if keys.acknowledged_annotation in (annotations or {}):
        said.append(
            f"annotation {keys.acknowledged_annotation} is ignored (the node's own kubelet may "
            "set it): a gpuhealth taint removed by hand is a GPUIncident of kind override "
            "(kubectl get gpuincidents), and resolving it puts the taint back "
            "(gpuhealth-controller incident resolve ID --reason TEXT; docs/operations.md, "
            "Removing a gpuhealth taint by hand)"
        )
    return "; ".join(said) if said else None


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        cache: NodeCache,
        nodes: NodeApi,
        *,
        settings: ReconcilerSettings,
        policy: PolicySettings,
        keys: Keys,
        gate: WriteGate,
        metrics: ControllerMetrics,
        dry_run: bool = False,
        clock: Clock | None = None,
        devices: DeviceTainter | None = None,
        hold: Callable[[NodeView], Hold | None] | None = None,
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.keys = keys
        self.dry_run = dry_run
        self.fleet = fleet
        self.cache = cache
        self.nodes = nodes
        self.gate = gate
        self.metrics = metrics
        self.devices = devices
        self.hold = hold
        """What the remediation loop holds on a node, or None: its quarantine taint, the
        autoscalers' annotations, a cordon (the episodes decide; the reconciler is the only
        writer of taints; before the episodes are known, the node as it is)."""
        self._clock = clock or SystemClock()
        rs = settings
        self.queue = WorkQueue(
            self._clock,
            backoff_base_s=rs.backoff_base_s,
            backoff_max_s=rs.backoff_max_s,
            name="node",
        )
        self.status_queue = WorkQueue(
            self._clock,
            backoff_base_s=rs.backoff_base_s,
            backoff_max_s=rs.backoff_max_s,
            name="status",
        )
        self._kube_events: asyncio.Queue[tuple[str, KubeEvent]] = asyncio.Queue(rs.event_queue_size)
        self._pending_status: dict[str, NodeCondition] = {}
        self._warned_overrides: set[str] = set()
        """Nodes told once (per controller start) that their old override label is ignored."""
        self.domain: Callable[[str], Taint | None] | None = None
        """The NVLink domain taint a node should carry
        (``gpuhealth.controller.incidents.domain_monitor``), or None; the reconciler alone writes
        taints, and governs that key on every node whose domain taint's incident is known."""
        self.domain_known: Callable[[str], bool] = lambda _domain: True
        """Whether the incident of a domain (a domain taint's value) is known, open or closed:
        a node without data keeps a domain taint whose incident is not (positive evidence
        only)."""
        self.on_plan: Callable[[NodePlan], None] | None = None
        """Test and dry-run hook: called with every non-empty plan."""
        self.acknowledgements: Acknowledgements | None = None
        """Taints removed by hand (the override incidents); None: every wanted taint is put
        back."""
        self.detects_overrides: Callable[[], bool] = lambda: False
        """Whether a hand removal seen in the node watch is recorded now (the leader, once it
        adopted the incidents: only it knows its own writes in flight)."""
        self._removing: dict[str, frozenset[Taint]] = {}
        """Node -> the taints of ours its patch in flight removes."""
        self.owns: Callable[[str], bool] = lambda _node: True
        """Past one process: whether this replica owns the node's shard now, asked right
        before each write (a shard lost stops its nodes' writes before the work stops)."""
        fleet.subscribe(self._on_fleet_change)
        cache.subscribe(self._on_node_change)
        gate.subscribe(on_trip=self._tripped, on_reset=lambda _blocked: self.enqueue_all())

    # -- triggers ----------------------------------------------------------------------------

    def _on_fleet_change(self, node: str, kind: ChangeKind) -> None:
        if kind == "health":
            self.queue.add(node)

    def _on_node_change(self, change: Change, old: NodeView | None, new: NodeView | None) -> None:
        if change == "left" and old is not None:  # another shard's now: nothing of it here
            self._pending_status.pop(old.name, None)
            if self.devices is not None:
                self.devices.forget(old.name)
            return
        if change == "deleted" and old is not None:
            self._pending_status.pop(old.name, None)
            if self.devices is not None and not self.dry_run:
                self.devices.want(old.name, (), True)  # the node's DeviceTaintRules go too
            acks = self.acknowledgements
            if acks is not None and self.detects_overrides():
                acks.settled(old.name, acks.of(old.name), "the node was deleted")
            return
        if old is not None and new is not None and old.taints != new.taints:
            self._notice_hand_removal(old, new)
        if new is not None and relevant_change(self.keys, old, new):
            self.queue.add(new.name)

    def _notice_hand_removal(self, old: NodeView, new: NodeView) -> None:
        acks = self.acknowledgements
        if acks is None or not self.detects_overrides():
            return
        gone = hand_removed(
            old,
            new,
            self.desired(new),
            self.keys,
            own_manager=CONTROLLER,
            in_flight=self._removing.get(new.name, frozenset()),
        )
        if gone:
            acks.removed_by_hand(new.name, gone, new.taints_by)

    def enqueue(self, node: str) -> None:
        self.queue.add(node)

    def enqueue_all(self) -> None:
        for name in self.cache.names():
            self.queue.add(name)

    # -- decisions ---------------------------------------------------------------------------

    def desired(self, view: NodeView) -> DesiredNode:
        excluded = view.labels.get(self.keys.exclude_label) == EXCLUDE_VALUE
        desired = desired_node(
            self.fleet.node_health(view.name),
            self.policy,
            self.keys,
            excluded=excluded,
            hold=self.hold(view) if self.hold is not None else None,
        )
        if self.domain is None or excluded:
            return desired
        taint = self.domain(view.name)
        key = self.keys.domain_taint
        known = all(
            self.domain_known(str(t.get("value") or "")) for t in view.taints if t.get("key") == key
        )
        return dataclasses.replace(
            desired,
            taints=desired.taints | {taint} if taint is not None else desired.taints,
            governed=desired.governed | {key} if known else desired.governed,
        )

    def plan(self, view: NodeView) -> tuple[NodePlan, DesiredNode]:
        desired = self.desired(view)
        pending = self._pending_status.get(view.name)
        if pending is not None:
            view = dataclasses.replace(view, condition=pending)
        acks = self.acknowledgements
        acked = acks.of(view.name) if acks is not None else frozenset()
        plan = plan_node(view, desired, self.keys, acknowledged=acked)
        refused: set[HardWriteKind] = set()
        for kind in plan.hard_writes:
            if not self.gate.request(HardWrite(view.name, kind, detail=_hard(plan))).allowed:
                refused.add(kind)
        if refused:
            plan = plan_node(
                view, desired, self.keys, acknowledged=acked, refused=frozenset(refused)
            )
        return plan, desired

    def _tripped(self, write: HardWrite, sentence: str) -> None:
        """The gate opened the breaker: tell people on the node that tripped it."""
        self._queue_kube_event(
            write.node, KubeEvent("Warning", EVENT_CIRCUIT_BREAKER_OPEN, sentence)
        )

    # -- workers -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Process the queues until cancelled (run only while leading)."""
        rs = self.settings
        self.enqueue_all()
        async with asyncio.TaskGroup() as tg:
            for i in range(rs.workers):
                tg.create_task(self._node_worker(), name=f"reconcile-node-{i}")
            for i in range(rs.status_workers):
                tg.create_task(self._status_worker(), name=f"reconcile-status-{i}")
            for i in range(rs.event_workers):
                tg.create_task(self._event_worker(), name=f"reconcile-events-{i}")
            tg.create_task(self._resync(), name="reconcile-resync")

    async def _resync(self) -> None:
        while True:
            await self._clock.sleep(self.settings.resync_interval_s)
            self.enqueue_all()

    async def _node_worker(self) -> None:
        await run_worker(self.queue, self._reconcile_counted, failure_event="reconcile_failed")

    async def _status_worker(self) -> None:
        await run_worker(
            self.status_queue, self._write_status, failure_event="condition_write_failed"
        )

    async def _reconcile_counted(self, name: str) -> bool:
        """:meth:`reconcile` with its result and duration in the metrics (a node worker)."""
        t0 = time.perf_counter()
        try:
            result = await self.reconcile(name)
        except ConflictError:
            self._count_pass("conflict", t0)
            raise
        except Exception:
            self._count_pass("error", t0)
            raise
        self._count_pass(result, t0)
        return True

    def _count_pass(self, result: str, t0: float) -> None:
        self.metrics.reconcile.labels(result).inc()
        self.metrics.reconcile_seconds.observe(time.perf_counter() - t0)

    async def reconcile(self, name: str) -> str:
        """One pass for one node; returns the result label (ok, dry_run)."""
        view = self.cache.get(name)
        if view is None or not self.owns(name):
            return "ok"
        self._warn_ignored_overrides(view)
        retries = self.settings.conflict_retries
        for _ in range(retries + 1):
            plan, desired = self.plan(view)
            if self.devices is not None and not self.dry_run:
                self.devices.want(name, desired.devices, desired.authoritative)
            if plan.settled and self.acknowledgements is not None:
                self.acknowledgements.settled(
                    name, frozenset(plan.settled), "the verdict changed or the node recovered"
                )
            if plan.empty:
                return "ok"
            if self.on_plan is not None:
                self.on_plan(plan)
            if self.dry_run:
                self._log_plan(plan, dry_run=True)
                return "dry_run"
            if plan.writes_node:
                self._removing[name] = frozenset(plan.removed)
                try:
                    new = await self.nodes.patch(name, plan.patch_body(view.resource_version))
                    self.cache.update(new)
                except ConflictError:
                    self.metrics.reconcile.labels("conflict").inc()
                    self._count_taint_ops(plan, "conflict")
                    view = await self.nodes.get(name)
                    self.cache.update(view)
                    continue
                except NotFoundError:
                    return "ok"
                except Exception:
                    self._count_taint_ops(plan, "error")
                    raise
                finally:
                    self._removing.pop(name, None)
                self._count_taint_ops(plan, "ok")
            if plan.condition is not None:
                self._pending_status[name] = plan.condition
                self.status_queue.add(name)
            self._log_plan(plan, dry_run=False)
            for ev in plan.events:
                self._queue_kube_event(name, ev)
            return "ok"
        raise ConflictError(f"node {name}: still conflicting after {retries} retries", 409)

    def _warn_ignored_overrides(self, view: NodeView) -> None:
        if view.name in self._warned_overrides:
            return
        message = ignored_overrides(self.keys, view.labels, view.annotations)
        if message is None:
            return
        self._warned_overrides.add(view.name)
        log.warning("override_label_ignored", node=view.name, message=message)
        self._queue_kube_event(view.name, KubeEvent("Warning", EVENT_OVERRIDE_IGNORED, message))

    def _count_taint_ops(self, plan: NodePlan, result: str) -> None:
        if plan.added:
            self.metrics.taint_ops.labels("add", result).inc(len(plan.added))
        if plan.removed:
            self.metrics.taint_ops.labels("remove", result).inc(len(plan.removed))

    def _log_plan(self, plan: NodePlan, *, dry_run: bool) -> None:
        if not (
            plan.added
            or plan.removed
            or plan.blocked
            or plan.settled
            or plan.guarded
            or plan.unguarded
            or dry_run
        ):
            return
        log.info(
            "node_planned" if dry_run else "node_reconciled",
            node=plan.node,
            dry_run=dry_run,
            added=[t.render() for t in plan.added],
            removed=[t.render() for t in plan.removed],
            blocked=[t.render() for t in plan.blocked],
            settled=[t.render() for t in plan.settled],
            labels=plan.labels,
            condition=plan.condition.reason if plan.condition else None,
            guarded=list(plan.guarded),
            unguarded=list(plan.unguarded),
        )

    async def _write_status(self, name: str) -> bool:
        """Write the node's pending ``GPUHealthy`` condition (a status worker)."""
        cond = self._pending_status.get(name)
        view = self.cache.get(name)
        if cond is None or view is None or not self.owns(name):
            self._pending_status.pop(name, None)
            return True
        if view.condition != cond:
            transition = view.condition is None or view.condition.status != cond.status
            now = self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            try:
                new = await self.nodes.patch_status(name, condition_body(cond, now, transition))
            except NotFoundError:
                self._pending_status.pop(name, None)
                return True
            self.cache.update(new)
        if self._pending_status.get(name) is cond:
            del self._pending_status[name]
        return True

    def queue_event(self, node: str, event: KubeEvent) -> None:
        """Post a Kubernetes Event about ``node`` (best effort, after its taints)."""
        self._queue_kube_event(node, event)

    def _queue_kube_event(self, node: str, event: KubeEvent) -> None:
        if self.dry_run:
            return
        try:
            self._kube_events.put_nowait((node, event))
        except asyncio.QueueFull:
            self.metrics.events_dropped.inc()

    async def _event_worker(self) -> None:
        while True:
            node, event = await self._kube_events.get()
            try:
                await self.nodes.create_event(node, event, self._clock.now())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.events_dropped.inc()
                log.warning("event_write_failed", node=node, reason=event.reason, error=str(exc))

    async def close(self) -> None:
        """Cancel pending delayed retries (after the workers stopped)."""
        await self.queue.close()
        await self.status_queue.close()

    def idle(self) -> bool:
        """Nothing queued or in flight (tests and benchmarks wait for this)."""
        return (
            len(self.queue) == 0
            and self.queue.processing == 0
            and len(self.status_queue) == 0
            and self.status_queue.processing == 0
            and self._kube_events.empty()
        )
