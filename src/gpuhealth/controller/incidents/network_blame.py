"""Network blame: the job crashes a faulting rail explains (pure), and the rail history that
feeds the decision.

A multi-node job dies on a flapping InfiniBand or RoCE port as surely as on a broken GPU: NCCL
fails on every rank, and the GPUs log the crash (XID 13, 43) like any application fault. The
agents' Snapshots say which ports fault and which GPUs sit behind each (``Snapshot.nics``:
the ``rail-down`` / ``rail-flapping`` verdicts, ``last_flap``). :class:`RailHistory` keeps, per
port, the *spells* it faulted in (each flap, and every moment a link verdict holds, extends
the spell or opens the next one), and the judge (:mod:`gpuhealth.controller.incidents.judge`)
asks two questions of them:

- :func:`explained`: did a rail behind this GPU fault within ``rail_grace_s`` of this report?
  Then the report does not count towards the GPU's blame (the GPU is not blamed for the
  network's fault); it still counts for the job's incident.
- :func:`job_rails`: which rails of the job's nodes faulted within ``rail_grace_s`` of its
  crash? The job incident names them (``subjects.rails``, its reason).

Only link faults count (:data:`LINK_FAULT_CODES` and flaps): a degraded rate or a rising error
counter slows a job down, it does not crash it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from gpuhealth.controller.fleet.health import port_name
from gpuhealth.controller.incidents.blame import JobFinding, XidOccurrence
from gpuhealth.protocol import NicPortInfo

LINK_FAULT_CODES = frozenset({"rail-down", "rail-flapping"})
"""Rail verdicts that take a job's traffic away (the link is down, or keeps going down)."""
MAX_SPELLS_PER_PORT = 16
"""Spells kept per port (the oldest dropped first): a port that faults this often within the
judge's horizon explains every crash on its GPUs anyway."""
MAX_NAMED_RAILS = 8
"""Rails a job incident's reason names (``subjects.rails`` has them all, to its bound)."""


@dataclass(frozen=True, slots=True)
class RailSpell:
    """A port's fault from ``start`` to ``end`` (monotonic seconds, the controller's clock)."""

    node: str
    port: str
    """``mlx5_0/1``."""
    gpus: frozenset[str]
    """UUIDs of the GPUs behind it."""
    start: float
    end: float
    codes: tuple[str, ...] = ()
    """The link verdicts it carried (empty: flaps only, below the agent's threshold)."""

    @property
    def rail(self) -> str:
        """``<node>/<device>/<port>``: how an incident names it."""
        return f"{self.node}/{self.port}"

    def near(self, start: float, end: float, grace: float) -> bool:
        """Does the spell lie within ``grace`` seconds of ``[start, end]``?"""
        return self.start - grace <= end and start <= self.end + grace


def explained(r: XidOccurrence, spells: Iterable[RailSpell], grace: float) -> RailSpell | None:
    """The rail spell behind ``r``'s GPU near its time (None: the network does not explain it)."""
    for s in spells:
        if s.node == r.node and r.gpu in s.gpus and s.near(r.at, r.at, grace):
            return s
    return None


def unexplained(
    reports: Sequence[XidOccurrence], spells: Sequence[RailSpell], grace: float
) -> list[XidOccurrence]:
    """The reports no rail spell explains: what a GPU's blame may count."""
    if not spells:
        return list(reports)
    return [r for r in reports if explained(r, spells, grace) is None]


def job_rails(f: JobFinding, spells: Iterable[RailSpell], grace: float) -> tuple[str, ...]:
    """The rails of the job's nodes that faulted within ``grace`` of its crash, sorted."""
    nodes = set(f.nodes)
    return tuple(
        sorted({s.rail for s in spells if s.node in nodes and s.near(f.first_at, f.last_at, grace)})
    )


def rail_note(rails: Sequence[str]) -> str:
    """The sentence a job incident's reason ends with when rails faulted under it."""
    if not rails:
        return ""
    named = ", ".join(rails[:MAX_NAMED_RAILS])
    more = f" and {len(rails) - MAX_NAMED_RAILS} more" if len(rails) > MAX_NAMED_RAILS else ""
    return (
        f"; rail {named}{more} went down or flapped meanwhile: the network's fault, the GPUs "
        "behind it not blamed"
    )


def _fault_points(nic: NicPortInfo, now: float, wall: datetime) -> list[float]:
    """The moments (monotonic) a Snapshot shows the port faulting: its last flap, and now when
    a link verdict holds."""
    points = []
    if nic.last_flap is not None:
        points.append(min(now, now - (wall - nic.last_flap).total_seconds()))
    if LINK_FAULT_CODES.intersection(nic.verdicts):
        points.append(now)
    return points


class RailHistory:
    """Each port's fault spells, from the agents' Snapshots; bounded by the judge's horizon.

    A spell a Snapshot showed faulting (a link verdict) is *ongoing*: it lasts until a Snapshot
    without the verdict, or the node's disconnection (:meth:`spells` extends it to ``now``).
    Points within ``merge_s`` of a spell's end extend it."""

    def __init__(self, *, merge_s: float, horizon_s: float) -> None:
        self._merge = merge_s
        self._horizon = horizon_s
        self._spells: dict[tuple[str, str], list[RailSpell]] = {}
        self._ongoing: set[tuple[str, str]] = set()

    def observe(self, node: str, nics: Sequence[NicPortInfo], now: float, wall: datetime) -> None:
        """A Snapshot's ports (the whole list: a port not in it is not faulting now)."""
        listed = set()
        for nic in nics:
            key = (node, port_name(nic))
            listed.add(key)
            points = _fault_points(nic, now, wall)
            codes = tuple(sorted(LINK_FAULT_CODES.intersection(nic.verdicts)))
            if codes:
                self._ongoing.add(key)
            else:
                self._ongoing.discard(key)
            for at in sorted(points):
                self._add(key, frozenset(nic.gpus), at, codes)
        for key in [k for k in self._ongoing if k[0] == node and k not in listed]:
            self._ongoing.discard(key)
        self._trim(now)

    def disconnected(self, node: str) -> None:
        """The node's agent is gone: its spells end where they were last seen."""
        self._ongoing = {k for k in self._ongoing if k[0] != node}

    def forget(self, node: str) -> None:
        self.disconnected(node)
        for key in [k for k in self._spells if k[0] == node]:
            del self._spells[key]

    def faulting(self) -> int:
        """Ports whose link verdict holds (their spell is ongoing)."""
        return len(self._ongoing)

    def spells(self, now: float) -> list[RailSpell]:
        """Every spell within the horizon, the ongoing ones lasting until ``now`` (older ones
        are dropped here too: a node gone quiet sends no Snapshot that would trim them)."""
        self._trim(now)
        out = []
        for key, spells in self._spells.items():
            for i, s in enumerate(spells):
                last = i == len(spells) - 1
                out.append(replace(s, end=now) if last and key in self._ongoing else s)
        return out

    def _add(
        self, key: tuple[str, str], gpus: frozenset[str], at: float, codes: tuple[str, ...]
    ) -> None:
        spells = self._spells.setdefault(key, [])
        if spells and spells[-1].start - self._merge <= at <= spells[-1].end + self._merge:
            s = spells[-1]
            spells[-1] = replace(
                s,
                gpus=s.gpus | gpus,
                start=min(s.start, at),
                end=max(s.end, at),
                codes=tuple(sorted(set(s.codes) | set(codes))),
            )
            return
        spells.append(RailSpell(key[0], key[1], gpus, at, at, codes))
        spells.sort(key=lambda s: s.start)
        del spells[:-MAX_SPELLS_PER_PORT]

    def _trim(self, now: float) -> None:
        horizon = now - self._horizon
        for key in list(self._spells):
            kept = [s for s in self._spells[key] if s.end >= horizon or key in self._ongoing]
            if kept:
                self._spells[key] = kept
            else:
                del self._spells[key]
