"""The status page's activity log: recent fleet activity in a bounded, in-memory ring fed by
listeners (not Kubernetes Events, not protocol Events: lines for a person to read).

It subscribes to the fleet (GPU state changes, agents connecting) and to the node watch
cache (taints under our prefix appearing or disappearing), and is told about idle
allocations and the circuit breaker when the page asks for the overview. It only reads the
objects it is given; a controller restart starts an empty log (Kubernetes Events are the
durable record). The overview JSON lists it under ``events``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.controller.fleet.view import taint_text
from gpuhealth.controller.names import Keys

if TYPE_CHECKING:
    from gpuhealth.controller.breaker.gate import BreakerStatus
    from gpuhealth.controller.fleet.model import ChangeKind, FleetReader, GpuRecord
    from gpuhealth.controller.idle.tracker import IdleAllocation
    from gpuhealth.controller.kube.node_view import NodeView

Severity = Literal["info", "warning", "error"]
DEFAULT_CAPACITY = 200
"""Activity entries kept; the oldest are dropped first."""

_QUIET = ("healthy", "unknown")
_STATE_SEVERITY: dict[str, Severity] = {
    "healthy": "info",
    "degraded": "warning",
    "unknown": "warning",
    "unhealthy": "error",
}


@dataclass(frozen=True, slots=True)
class Activity:
    at: datetime
    node: str
    kind: str
    """``gpu``, ``agent``, ``taint``, ``untaint``, ``idle``, ``breaker``."""
    severity: Severity
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "node": self.node,
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
        }


class NodeViewReader(Protocol):
    """What the page reads of the node watch cache
    (``gpuhealth.controller.kube.node_cache.NodeCache``)."""

    def views(self) -> list[NodeView]: ...

    def get(self, name: str) -> NodeView | None: ...

    def subscribe(self, listener: Any) -> None: ...


def describe_gpu(gpu: GpuRecord) -> str:
    """``XidError xid-79 (GPU has fallen off the bus), action RESTART_BM`` or the bare state."""
    parts = []
    for c in gpu.conditions:
        text = f"{c.reason} {c.code}"
        if c.message:
            text += f" ({c.message})"
        if c.action and c.action != "NONE":
            text += f", action {c.action}"
        parts.append(text)
    return "; ".join(parts) or gpu.state


def owned_taints(taints: Iterable[Mapping[str, Any]], keys: Keys) -> set[str]:
    return {taint_text(t) for t in taints if keys.owns(str(t.get("key", "")))}


class ActivityLog:
    def __init__(
        self, keys: Keys, capacity: int = DEFAULT_CAPACITY, clock: Clock | None = None
    ) -> None:
        self.keys = keys
        self._clock = clock or SystemClock()
        self._entries: deque[Activity] = deque(maxlen=capacity)
        self._gpu_states: dict[tuple[str, str], str] = {}
        self._idle: set[tuple[str, str, str, str]] = set()
        self._breaker_open = False

    def note(self, node: str, kind: str, severity: Severity, message: str) -> None:
        self._entries.append(Activity(self._clock.now(), node, kind, severity, message))

    def recent(self, limit: int | None = None) -> list[Activity]:
        """Newest first."""
        items = list(reversed(self._entries))
        return items if limit is None else items[:limit]

    # -- feeds -------------------------------------------------------------------------------

    def attach_fleet(self, fleet: FleetReader) -> None:
        def on_change(node: str, kind: ChangeKind) -> None:
            if kind == "connection":
                rec = fleet.node(node)
                up = rec is not None and rec.connected
                message = "agent connected" if up else "agent disconnected"
                self.note(node, "agent", "info" if up else "warning", message)
            elif kind == "health":
                self.observe_gpus(node, fleet)
            elif kind == "removed":
                self.note(node, "agent", "warning", "node removed")

        fleet.subscribe(on_change)

    def observe_gpus(self, node: str, fleet: FleetReader) -> None:
        rec = fleet.node(node)
        if rec is None:
            return
        if rec.silent:
            self.note(node, "agent", "warning", "agent silent: node state unknown")
        for g in rec.gpus_by_index():
            key = (node, g.info.uuid)
            before = self._gpu_states.get(key)
            self._gpu_states[key] = g.state
            if before == g.state or (before in (None, "unknown") and g.state in _QUIET):
                continue  # a GPU coming up healthy (or not reported yet) is no news
            was = before or "new"
            why = f": {describe_gpu(g)}" if g.state != "healthy" else ""
            self.note(
                node,
                "gpu",
                _STATE_SEVERITY.get(g.state, "warning"),
                f"GPU {g.info.index}: {was} -> {g.state}{why}",
            )

    def attach_nodes(self, nodes: NodeViewReader) -> None:
        def on_change(change: str, old: NodeView | None, new: NodeView | None) -> None:
            self.observe_taints(old, new)

        nodes.subscribe(on_change)

    def observe_taints(self, old: NodeView | None, new: NodeView | None) -> None:
        view = new if new is not None else old
        if view is None:
            return
        name = view.name
        before = owned_taints(old.taints, self.keys) if old is not None else set()
        after = owned_taints(new.taints, self.keys) if new is not None else set()
        for t in sorted(after - before):
            hard = t.endswith((":NoSchedule", ":NoExecute"))
            self.note(name, "taint", "error" if hard else "warning", f"tainted {t}")
        for t in sorted(before - after):
            self.note(name, "untaint", "info", f"untainted {t}")

    def observe_idle(self, idle: Sequence[IdleAllocation]) -> None:
        now = {(a.namespace, a.pod, a.container, a.uuid): a for a in idle}
        for key in sorted(now.keys() - self._idle):
            a = now[key]
            self.note(
                a.node,
                "idle",
                "warning",
                f"pod {a.namespace}/{a.pod} holds GPU {a.gpu} idle for {a.idle_for_s:.0f}s",
            )
        for ns, pod, _container, _uuid in sorted(self._idle - now.keys()):
            self.note("", "idle", "info", f"pod {ns}/{pod} no longer idle")
        self._idle = set(now)

    def observe_breaker(self, status: BreakerStatus) -> None:
        if status.open and not self._breaker_open:
            blocked = ", ".join(status.blocked_nodes) or "-"
            self.note("", "breaker", "error", f"circuit breaker OPEN: blocked {blocked}")
        elif self._breaker_open and not status.open:
            self.note("", "breaker", "info", "circuit breaker reset")
        self._breaker_open = status.open
