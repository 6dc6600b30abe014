"""GPU nodes nobody watches: a node with GPUs (GPU feature discovery's
``nvidia.com/gpu.present=true`` label or GPU capacity) whose agent never reported, or stopped
and never came back, for longer than ``incidents.unwatched.grace_s``.

:func:`unwatched` is the pure decision. :class:`UnwatchedWatch` runs it every
``check_interval_s`` over the node watch cache and the fleet (memory only), keeps one
``unwatched`` incident per such node, and tells the fleet (``Fleet.missing``: the node's
report says ``missing``) and the reconciler (enqueued only when a node's verdict changes). The
reconciler then writes ``GPUHealthy=Unknown/AgentMissing`` like every other verdict: leader
only, level-triggered against the cache, nothing written while the fleet is quiet. A node
whose agent stopped while this controller watched keeps the reconciler's
``AgentNotReporting`` condition (the incident still names it).

Only the leader judges (a replica that does not lead hears no agent: every GPU node would be
unwatched there). A new leader adopts the unwatched incidents from their GPUIncidents
(:meth:`UnwatchedWatch.adopt`) and counts the grace of every other node from its takeover:
the agents reconnect to it meanwhile. An operator's resolve closes the incident and starts the
node's grace again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.lifecycle import OnCallAction, resolution
from gpuhealth.controller.incidents.model import Incident, IncidentBook, Subjects
from gpuhealth.controller.incidents.settings import UnwatchedSettings

log = get_logger("incidents")

Why = Literal["never-reported", "stopped-reporting"]


@dataclass(frozen=True, slots=True)
class NodeFact:
    name: str
    gpu_node: bool
    gpus: int
    first_seen: float
    """Monotonic time this controller first saw the node."""
    reporting: bool
    """Its agent reports now (a Snapshot, not silent)."""
    last_heard: float | None
    """Monotonic time of its agent's last message, None: never since this controller started."""
    excluded: bool = False


@dataclass(frozen=True, slots=True)
class Unwatched:
    name: str
    why: Why
    gpus: int


def unwatched(facts: Iterable[NodeFact], now: float, grace_s: float) -> list[Unwatched]:
    """GPU nodes with no reporting agent for ``grace_s`` (excluded nodes are nobody's)."""
    out = []
    for f in facts:
        if not f.gpu_node or f.reporting or f.excluded:
            continue
        since = max(f.first_seen, f.last_heard or f.first_seen)
        if now - since >= grace_s:
            why: Why = "never-reported" if f.last_heard is None else "stopped-reporting"
            out.append(Unwatched(f.name, why, f.gpus))
    return sorted(out, key=lambda u: u.name)


class WatchedNode(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def gpus(self) -> int: ...


class NodeViews(Protocol):
    def views(self) -> Sequence[WatchedNode]: ...


REASONS: dict[Why, str] = {
    "never-reported": "GPU node with no gpuhealth agent: none has reported since this "
    "controller started",
    "stopped-reporting": "GPU node whose gpuhealth agent stopped reporting and never came back",
}


class UnwatchedWatch:
    def __init__(
        self,
        settings: UnwatchedSettings,
        book: IncidentBook,
        fleet: Fleet,
        nodes: NodeViews,
        *,
        clock: Clock,
        exclude_label: str,
        enqueue: Callable[[str], None],
        synced: Callable[[], bool] = lambda: True,
        leading: Callable[[], bool] = lambda: True,
        taint: bool = False,
    ) -> None:
        """``taint``: ``policy.taint_on_agent_missing`` (what the decision says);
        ``leading``: whether this replica leads (only the leader judges)."""
        self.s = settings
        self.book = book
        self.fleet = fleet
        self._nodes = nodes
        self._clock = clock
        self._exclude = exclude_label
        self._enqueue = enqueue
        self._synced = synced
        self._leading = leading
        self._taint = taint
        self._first_seen: dict[str, float] = {}
        self._current: dict[str, Unwatched] = {}
        fleet.missing = self.is_missing

    def is_missing(self, name: str) -> bool:
        return name in self._current

    def count(self) -> int:
        return len(self._current)

    def facts(self) -> list[NodeFact]:
        """The facts of every node that could be unwatched: a node whose agent reports is
        left out (at 19,000 nodes a fact for each took 100-150 ms of the event loop every
        ``check_interval_s``)."""
        now = self._clock.monotonic()
        out = []
        names = set()
        for v in self._nodes.views():
            names.add(v.name)
            first = self._first_seen.setdefault(v.name, now)
            rec = self.fleet.node(v.name)
            if rec is not None and rec.has_snapshot and not rec.silent:
                continue
            gpu_node = v.gpus > 0 or v.labels.get(self.s.gpu_present_label) == "true"
            out.append(
                NodeFact(
                    name=v.name,
                    gpu_node=gpu_node,
                    gpus=v.gpus,
                    first_seen=first,
                    reporting=False,
                    last_heard=rec.last_seen if rec is not None and rec.last_seen else None,
                    excluded=v.labels.get(self._exclude) == "true",
                )
            )
        for gone in set(self._first_seen) - names:
            del self._first_seen[gone]
        return out

    def check(self) -> list[str]:
        """One pass; the nodes whose verdict changed (enqueued for the reconciler)."""
        if not self.s.enabled or not self._synced() or not self._leading():
            return []
        now = self._clock.monotonic()
        wall = self._clock.now()
        found = {u.name: u for u in unwatched(self.facts(), now, self.s.grace_s)}
        changed = sorted(set(found) ^ set(self._current))
        for name in sorted(set(self._current) - set(found)):
            inc = self.book.find("unwatched", name)
            if inc is not None:
                self.book.close(inc.id, wall, reason="its agent reports again (or it is gone)")
            log.info("node-watched-again", node=name)
        for name, u in found.items():
            if name not in self._current:
                log.warning("node-unwatched", node=name, why=u.why, gpus=u.gpus)
            self.book.open(
                "unwatched",
                name,
                subjects=Subjects(nodes=(name,)),
                decision=(
                    "condition AgentMissing + taint"
                    if u.why == "never-reported" and self._taint
                    else "condition AgentMissing"
                    if u.why == "never-reported"
                    else "condition AgentNotReporting"
                ),
                reason=REASONS[u.why],
                now=wall,
                evidence={"gpus": u.gpus, "grace_s": int(self.s.grace_s)},
            )
        self._current = found
        for name in changed:
            self._enqueue(name)
        return changed

    def adopt(self, incidents: Sequence[Incident]) -> None:
        """A new leader's unwatched nodes: the open unwatched incidents; every other node's
        grace counts from now (the adopted ones' is over: they stay unwatched)."""
        found = {}
        for i in incidents:
            if i.kind != "unwatched" or not i.open:
                continue
            why: Why = next(
                (w for w, text in REASONS.items() if text == i.reason), "stopped-reporting"
            )
            found[i.key] = Unwatched(i.key, why, int(i.evidence.get("gpus", 0)))
        self._current = found
        over = self._clock.monotonic() - self.s.grace_s
        self._first_seen = dict.fromkeys(found, over)

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        """An operator resolved an unwatched node: closed, its grace starts again."""
        name = incident.key
        self._current.pop(name, None)
        self._first_seen[name] = self._clock.monotonic()
        self.book.close(incident.id, self._clock.now(), reason=resolution(action))
        self._enqueue(name)

    async def run(self) -> None:
        """The named task ``unwatched-nodes``."""
        while True:
            await self._clock.sleep(self.s.check_interval_s)
            self.check()
