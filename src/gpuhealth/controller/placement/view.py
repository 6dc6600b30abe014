"""Per-node placement summaries, recomputed when the fleet changes so a request is a lookup.

:class:`PlacementIndex` follows the fleet and keeps a precomputed :class:`NodeSummary` per
node. A node without a reporting agent has no summary: the extender neither fails nor
favours it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import msgspec

from gpuhealth.controller.fleet.model import ChangeKind, Fleet
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.protocol import Allocation, Condition, GpuInfo, GpuTelemetry

FAILURE_MESSAGES_SHARED = 4096
"""Distinct filter failure messages kept to be shared between node summaries (a bound on
the cache, not a setting: a message beyond it is made again, never wrong)."""

USABLE_STATES = frozenset({"healthy", "degraded"})
"""GPU states a pod may be placed on; ``unhealthy`` and ``unknown`` GPUs are not counted."""


class GpuView(Protocol):
    """What a summary reads of a GPU (``gpuhealth.protocol.GpuStatus`` and ``fleet.GpuRecord``
    fit)."""

    @property
    def info(self) -> GpuInfo: ...
    @property
    def state(self) -> str: ...
    @property
    def conditions(self) -> Sequence[Condition]: ...
    @property
    def telemetry(self) -> GpuTelemetry | None: ...


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node: str
    total: int
    usable: int
    """Healthy or degraded GPUs."""
    free: int
    """Usable GPUs that no running pod holds."""
    unusable: tuple[str, ...]
    """``GPU-… (xid-79)`` for each unhealthy or unknown GPU, for failure messages."""
    degraded: int
    score: int
    """Prioritize score 0..10."""
    detail: str = ""
    """The end of a filter failure message: `` (1 of 8 unhealthy: xid-79)``."""
    failure_messages: tuple[str, ...] = ()
    """Filter failure message by requested count (index = request, up to ``total``)."""
    priority_json: bytes = b""
    """This node's ``{"Host":…,"Score":…}`` entry, precomputed for prioritize."""


def _clamp01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def quality(telemetry: Iterable[GpuTelemetry], s: ExtenderSettings) -> float:
    """0..1 from thermal headroom, recent correctable errors and memory-bandwidth contention,
    averaged over the GPUs that report each figure; 0.5 when nothing is reported."""
    headroom: list[float] = []
    sbe_total = 0
    sbe_seen = False
    bandwidth: list[float] = []
    for t in telemetry:
        if t.temperature_c is not None and t.slowdown_temperature_c is not None:
            headroom.append(
                _clamp01((t.slowdown_temperature_c - t.temperature_c) / s.thermal_full_headroom_c)
            )
        if t.sbe_recent is not None:
            sbe_total += t.sbe_recent
            sbe_seen = True
        if t.memory_bandwidth_ratio is not None:
            bandwidth.append(1.0 - t.memory_bandwidth_ratio)
    terms: list[tuple[float, float]] = []
    if headroom:
        terms.append((s.thermal_weight, sum(headroom) / len(headroom)))
    if sbe_seen:
        terms.append((s.ecc_weight, 1.0 / (1.0 + sbe_total / s.sbe_half_score)))
    if bandwidth:
        terms.append((s.bandwidth_weight, sum(bandwidth) / len(bandwidth)))
    weight = sum(w for w, _ in terms)
    if weight <= 0:
        return 0.5
    return sum(w * v for w, v in terms) / weight


def node_score(usable: int, degraded: int, q: float) -> int:
    """Healthy nodes score 6..10 and degraded ones 1..5 by quality ``q``, so a healthy node
    always wins over a degraded one; a node without usable GPUs scores 0."""
    if usable == 0:
        return 0
    if degraded == 0:
        return 6 + round(4 * q)
    healthy_fraction = (usable - degraded) / usable
    return 1 + round(4 * q * (0.5 + 0.5 * healthy_fraction))


def summarize(
    node: str,
    gpus: Iterable[GpuView],
    allocations: Iterable[Allocation],
    s: ExtenderSettings,
) -> NodeSummary:
    """The placement view of one node: a GPU is free when it is usable and no allocation
    (from the kubelet's PodResources, i.e. a running pod) holds it exclusively."""
    # A time-sliced replica (``UUID::N``) does not take the whole GPU: kube-scheduler's own
    # nvidia.com/gpu accounting already counts replicas, so only exclusive holds count here.
    held = {a.gpu_uuid for a in allocations if "::" not in a.device_id}
    total = usable = free = degraded = 0
    unusable: list[str] = []
    codes: list[str] = []
    tel: list[GpuTelemetry] = []
    for g in gpus:
        total += 1
        uuid = g.info.uuid
        if g.state in USABLE_STATES:
            usable += 1
            degraded += g.state == "degraded"
            free += uuid not in held
            if g.telemetry is not None:
                tel.append(g.telemetry)
        else:
            gpu_codes = [c.code for c in g.conditions] or [g.state]
            codes.extend(gpu_codes)
            unusable.append(f"{uuid} ({','.join(gpu_codes)})")
    score = node_score(usable, degraded, quality(tel, s))
    detail = failure_detail(total, usable, free, codes)
    return NodeSummary(
        node=node,
        total=total,
        usable=usable,
        free=free,
        unusable=tuple(unusable),
        degraded=degraded,
        score=score,
        detail=detail,
        failure_messages=tuple(failure_message(free, need, detail) for need in range(total + 1)),
        priority_json=priority_entry(node, score),
    )


def failure_detail(total: int, usable: int, free: int, codes: Iterable[str]) -> str:
    """Counts and condition codes, never GPU UUIDs: kube-scheduler's FailedScheduling event
    groups nodes by identical message, so messages must repeat across nodes to stay short."""
    if total == usable:
        return f" ({usable - free} of {usable} held by pods)"
    return f" ({total - usable} of {total} unhealthy: {', '.join(sorted(set(codes)))})"


@functools.lru_cache(maxsize=FAILURE_MESSAGES_SHARED)
def failure_message(free: int, need: int, detail: str) -> str:
    """One string per distinct message, shared by every node whose summary has it (nodes
    alike in a large fleet: one copy, not one per node and requested count)."""
    return f"gpuhealth: {free} free healthy GPU(s), pod needs {need}{detail}"


def priority_entry(node: str, score: int) -> bytes:
    """``{"Host":"<node>","Score":<score>}`` as JSON."""
    return b'{"Host":' + msgspec.json.encode(node) + b',"Score":' + str(score).encode() + b"}"


class PlacementIndex:
    """Node summaries kept current from the fleet; reads are dictionary lookups.

    Subscribes to :class:`gpuhealth.controller.fleet.model.Fleet` and recomputes a node's summary
    when its health, connection, allocations or telemetry (``usage``) change. A node whose agent has
    not sent a snapshot yet, or has gone silent, has no summary (unknown to the extender).
    """

    def __init__(self, fleet: Fleet, settings: ExtenderSettings | None = None) -> None:
        self.settings = settings or ExtenderSettings()
        self._fleet = fleet
        self.summaries: dict[str, NodeSummary] = {}
        self._seen: dict[str, tuple[int, int]] = {}
        """Node -> its record's ``version`` and ``telemetry_version`` when its summary was
        last computed (a Heartbeat that moved neither changes nothing here)."""
        self.computed = 0
        """Summaries computed in full since start (tests and the benchmark read it)."""
        for rec in fleet.nodes():
            self.refresh(rec.name)
        fleet.subscribe(self._on_change)

    def _on_change(self, node: str, kind: ChangeKind) -> None:
        if kind == "usage":  # a Heartbeat: only its telemetry matters here, and only the score
            self._rescore(node)
        else:
            self.refresh(node)

    def refresh(self, node: str) -> None:
        rec = self._fleet.node(node)
        if rec is None or rec.silent or not rec.has_snapshot:
            self.summaries.pop(node, None)
            self._seen.pop(node, None)
            return
        self.computed += 1
        self._seen[node] = (rec.version, rec.telemetry_version)
        self.summaries[node] = summarize(node, rec.gpus.values(), rec.allocations, self.settings)

    def _rescore(self, node: str) -> None:
        """After a Heartbeat: nothing when the record moved neither version since the summary;
        when only its telemetry changed, the score again (a new summary only where the score
        differs); otherwise the whole summary."""
        rec = self._fleet.node(node)
        old = self.summaries.get(node)
        seen = self._seen.get(node)
        if rec is None or old is None or seen is None or rec.silent or not rec.has_snapshot:
            self.refresh(node)
            return
        if seen[0] != rec.version:
            self.refresh(node)
            return
        if seen[1] == rec.telemetry_version:
            return
        self._seen[node] = (rec.version, rec.telemetry_version)
        tel = [
            g.telemetry
            for g in rec.gpus.values()
            if g.state in USABLE_STATES and g.telemetry is not None
        ]
        score = node_score(old.usable, old.degraded, quality(tel, self.settings))
        if score != old.score:
            self.summaries[node] = replace(
                old, score=score, priority_json=priority_entry(node, score)
            )
