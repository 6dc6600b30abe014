"""Tracks per-allocation utilisation windows from heartbeats and reports idle allocations.

Feed it with :meth:`IdleTracker.attach` (fleet ``usage`` changes) or :meth:`observe`. Every
``evaluate_interval_s`` it applies the pure rules of :mod:`gpuhealth.controller.idle.rules` to every
window, refreshes the metrics (``gpuhealth_idle_allocation``,
``gpuhealth_idle_allocation_duration_seconds``, exported at scrape time from the last
evaluation), and queues pod writes: an Event ``GPUIdle`` once per window of idleness and,
when enabled, the annotation ``idle-since`` (removed when the allocation is busy again).
It never evicts. Memory is bounded: windows are O(1), forgotten after ``stale_after_s``
without a heartbeat, and capped at ``max_allocations``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import GpuHealthError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.idle.rules import (
    IdlePolicies,
    IdlePolicy,
    UsageWindow,
    event_due,
    observe,
    start_window,
    verdict,
)
from gpuhealth.controller.idle.settings import IdleSettings
from gpuhealth.controller.names import EVENT_GPU_IDLE
from gpuhealth.protocol import AllocationUsage

if TYPE_CHECKING:
    from gpuhealth.controller.fleet.model import ChangeKind, Fleet, GpuRecord

log = get_logger("idle")

LABELS = ("namespace", "pod", "container", "node", "gpu", "uuid", "attribution")
Key = tuple[str, str, str, str]
"""(namespace, pod, container, gpu uuid)."""


class PodWriter(Protocol):
    """What the tracker writes (``gpuhealth.controller.idle.pod_writes.PodApi`` implements it)."""

    async def create_event(
        self, namespace: str, pod: str, reason: str, message: str, now: datetime
    ) -> bool: ...

    async def set_annotation(
        self, namespace: str, pod: str, key: str, value: str | None
    ) -> bool: ...


@dataclass(slots=True)
class _Tracked(UsageWindow):
    """A window plus what the metrics and pod writes need."""

    key: Key = ("", "", "", "")
    policy: IdlePolicy = field(default_factory=IdlePolicy)
    node: str = ""
    gpu: str = ""
    attribution: str = "gpu"
    last_event_idle_for: float | None = None
    annotated: bool = False

    @property
    def labels(self) -> list[str]:
        """Its series' label values (built when exported: only idle allocations are)."""
        k = self.key
        return [k[0], k[1], k[2], self.node, self.gpu, k[3], self.attribution]


def _shared_key(key: Key) -> Key:
    """The names interned: kept for the allocation's life, shared with the fleet's records
    (a heartbeat's own strings are dropped once it is applied)."""
    return (sys.intern(key[0]), sys.intern(key[1]), sys.intern(key[2]), sys.intern(key[3]))


class _GpuIndex(Mapping[str, str]):
    """GPU UUID -> its index, read from the node's GPU records only when a new allocation
    needs it (not once per Heartbeat)."""

    __slots__ = ("_gpus",)

    def __init__(self, gpus: Mapping[str, GpuRecord]) -> None:
        self._gpus = gpus

    def __getitem__(self, uuid: str) -> str:
        return sys.intern(str(self._gpus[uuid].info.index))  # "0".."7", shared by every node

    def __iter__(self) -> Iterator[str]:
        return iter(self._gpus)

    def __len__(self) -> int:
        return len(self._gpus)


@dataclass(frozen=True, slots=True)
class IdleAllocation:
    namespace: str
    pod: str
    container: str
    node: str
    gpu: str
    uuid: str
    attribution: str
    idle_for_s: float
    threshold_ratio: float
    window_s: float

    def message(self) -> str:
        minutes = self.idle_for_s / 60
        return (
            f"container {self.container} holds GPU {self.gpu} ({self.uuid}) on node {self.node} "
            f"but used under {self.threshold_ratio:.0%} of it for {minutes:.0f} min "
            f"(attribution: {self.attribution}); gpuhealth never evicts"
        )


def _allocation(t: _Tracked, idle_for: float) -> IdleAllocation:
    return IdleAllocation(
        namespace=t.key[0],
        pod=t.key[1],
        container=t.key[2],
        node=t.node,
        gpu=t.gpu,
        uuid=t.key[3],
        attribution=t.attribution,
        idle_for_s=idle_for,
        threshold_ratio=t.policy.threshold_ratio,
        window_s=t.policy.window_s,
    )


@dataclass(frozen=True, slots=True)
class PodWrite:
    kind: str
    """``event``, ``annotate`` or ``unannotate``."""
    allocation: IdleAllocation


class IdleTracker:
    def __init__(
        self,
        config: IdleSettings | None = None,
        clock: Clock | None = None,
        writer: PodWriter | None = None,
        should_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config or IdleSettings()
        self._policies = IdlePolicies.from_config(self.config)
        self._clock = clock or SystemClock()
        self._writer = writer
        self._should_act = should_act
        self._tracked: dict[Key, _Tracked] = {}
        self._by_node: dict[str, list[Key]] = {}
        """A node's allocations: a list (a node holds a handful; a set of 8 costs 6x more)."""
        self.idle: list[tuple[_Tracked, float]] = []
        """Result of the last evaluation: (allocation, seconds idle)."""
        self.pending: list[PodWrite] = []
        self.dropped = 0
        """Allocations not tracked because ``max_allocations`` was reached."""
        self.write_errors = 0

    def __len__(self) -> int:
        return len(self._tracked)

    # -- input -------------------------------------------------------------------------------

    def attach(self, fleet: Fleet) -> None:
        """Follow the fleet: ``usage`` changes feed windows, ``removed`` nodes are forgotten."""

        def on_change(node: str, kind: ChangeKind) -> None:
            if kind == "removed":
                self.forget_node(node)

        def on_usage(node: str, usage: Sequence[AllocationUsage]) -> None:
            rec = fleet.node(node)
            if rec is not None:
                self.observe(node, usage, _GpuIndex(rec.gpus))

        fleet.subscribe(on_change)
        fleet.subscribe_usage(on_usage)

    def observe(
        self, node: str, usage: Iterable[AllocationUsage], gpu_index: Mapping[str, str]
    ) -> None:
        """Fold one heartbeat's usage of ``node`` into the windows (at the clock's now)."""
        now = self._clock.monotonic()
        max_gap = self.config.max_gap_s
        for u in usage:
            key = (u.namespace, u.pod, u.container, u.gpu_uuid)
            t = self._tracked.get(key)
            if t is not None and t.node != node:
                self._drop(t)  # same name on another node: a new pod, a new window
                t = None
            if t is None:
                if len(self._tracked) >= self.config.max_allocations:
                    self.dropped += 1
                    continue
                policy = self._policies.for_namespace(u.namespace)
                w = start_window(u.utilization_ratio, now, policy.threshold_ratio)
                t = _Tracked(
                    first_seen=w.first_seen,
                    last_seen=w.last_seen,
                    idle_since=w.idle_since,
                    key=_shared_key(key),
                    policy=policy,
                    node=node,
                    gpu=gpu_index.get(u.gpu_uuid, ""),
                    attribution=u.attribution,
                )
                self._tracked[t.key] = t
                self._by_node.setdefault(node, []).append(t.key)
                continue
            observe(t, u.utilization_ratio, now, t.policy.threshold_ratio, max_gap)
            if t.attribution != u.attribution:
                t.attribution = u.attribution

    def _drop(self, t: _Tracked) -> None:
        del self._tracked[t.key]
        keys = self._by_node.get(t.node)
        if keys is not None:
            with contextlib.suppress(ValueError):
                keys.remove(t.key)
            if not keys:
                del self._by_node[t.node]

    def forget_node(self, node: str) -> None:
        for key in self._by_node.pop(node, ()):
            self._tracked.pop(key, None)

    # -- evaluation --------------------------------------------------------------------------

    def evaluate(self) -> list[tuple[_Tracked, float]]:
        """Verdicts for every window: updates :attr:`idle` (tracked, idle seconds) and
        queues pod writes. Busy windows cost one comparison."""
        now = self._clock.monotonic()
        max_gap = self.config.max_gap_s
        stale_after = self.config.stale_after_s
        idle: list[tuple[_Tracked, float]] = []
        stale: list[_Tracked] = []
        writes = self.pending
        annotate = self.config.annotate
        events = self.config.emit_events
        for t in self._tracked.values():
            if now - t.last_seen > stale_after:
                stale.append(t)
                continue
            if t.idle_since is None and not t.annotated:
                t.last_event_idle_for = None
                continue
            v = verdict(t, t.policy, now, max_gap)
            if not v.idle:
                t.last_event_idle_for = None
                if t.annotated and v.reason in ("busy", "recent-activity"):
                    t.annotated = False
                    writes.append(PodWrite("unannotate", _allocation(t, 0.0)))
                continue
            idle.append((t, v.idle_for_s))
            if events and event_due(v.idle_for_s, t.policy.window_s, t.last_event_idle_for):
                t.last_event_idle_for = v.idle_for_s
                writes.append(PodWrite("event", _allocation(t, v.idle_for_s)))
            if annotate and not t.annotated:
                t.annotated = True
                writes.append(PodWrite("annotate", _allocation(t, v.idle_for_s)))
        for t in stale:
            self._drop(t)
        if len(writes) > self.config.max_pending_writes:
            del writes[: len(writes) - self.config.max_pending_writes]
        self.idle = idle
        return idle

    def idle_allocations(self) -> list[IdleAllocation]:
        """The last evaluation's idle allocations, as records (status page, tests)."""
        return [_allocation(t, idle_for) for t, idle_for in self.idle]

    async def flush(self) -> int:
        """Send the queued pod writes (only when ``should_act``, e.g. on the leader)."""
        writes, self.pending = self.pending, []
        if self._writer is None or not self._should_act():
            return 0
        done = 0
        now = self._clock.now()
        for w in writes:
            a = w.allocation
            try:
                if w.kind == "event":
                    await self._writer.create_event(
                        a.namespace, a.pod, EVENT_GPU_IDLE, a.message(), now
                    )
                    log.info("gpu_idle", pod=a.pod, namespace=a.namespace, gpu=a.uuid)
                elif w.kind == "annotate":
                    since = now - timedelta(seconds=a.idle_for_s)
                    value = since.strftime("%Y-%m-%dT%H:%M:%SZ")
                    await self._writer.set_annotation(
                        a.namespace, a.pod, self.config.annotation_key, value
                    )
                else:
                    await self._writer.set_annotation(
                        a.namespace, a.pod, self.config.annotation_key, None
                    )
                done += 1
            except GpuHealthError as exc:
                self.write_errors += 1
                log.warning("idle_write_failed", kind=w.kind, pod=a.pod, error=str(exc))
        return done

    async def run(self) -> None:
        """The supervised loop: evaluate, then write, every ``evaluate_interval_s``."""
        while True:
            await self._clock.sleep(self.config.evaluate_interval_s)
            self.evaluate()
            await self.flush()

    def collector(self) -> IdleCollector:
        return IdleCollector(self)


class IdleCollector(Collector):
    """Exports the last evaluation: one series per idle allocation."""

    def __init__(self, tracker: IdleTracker) -> None:
        self._t = tracker

    def collect(self) -> Iterator[GaugeMetricFamily]:
        idle = GaugeMetricFamily(
            "gpuhealth_idle_allocation", "1 while the allocation is idle", labels=LABELS
        )
        duration = GaugeMetricFamily(
            "gpuhealth_idle_allocation_duration_seconds",
            "How long the allocation has been idle",
            labels=LABELS,
        )
        for t, idle_for in self._t.idle:
            idle.add_metric(t.labels, 1.0)
            duration.add_metric(t.labels, idle_for)
        yield idle
        yield duration
