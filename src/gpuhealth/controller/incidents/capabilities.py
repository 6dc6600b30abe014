"""Agents that cannot carry out what the remediation loop needs, fleet-wide, as one incident.

An episode whose node's agent cannot execute its action (no reboot executor, no diagnostic
program: the agents' settings) escalates ``NoExecutor`` before anything is disrupted, with no
RMA label (the hardware is not at fault), and counts against the escalation limit: the
nodes past it wait in Pending with the same reason. A setting missing from every agent shows
as one ``capability`` incident (key ``no-executor``) naming every such node, not one RMA
label per node.

:func:`no_executor` is the pure decision over the episodes; :class:`CapabilityWatch` runs it
every ``incidents.capability_check_s`` on every replica (the episodes' watch cache) and keeps
the incident open while any such episode is unresolved (escalated and not released or
deleted, or waiting), closing it once none is. An operator who resolves it (having fixed the
agents' settings) closes it: the episodes detected before the resolution no longer count,
and a new leader takes that time over from the incident's object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.lifecycle import OnCallAction, resolution
from gpuhealth.controller.incidents.model import Incident, IncidentBook, Subjects
from gpuhealth.controller.remediation.escalation import NO_EXECUTOR
from gpuhealth.controller.remediation.model import Episode, Phase

log = get_logger("incidents")

KEY = "no-executor"
DECISION = "no RMA label; escalations capped"
MAX_NODES = 100
"""Nodes named in the incident (the counts cover all of them)."""


@dataclass(frozen=True, slots=True)
class NoExecutor:
    """The episodes whose agent cannot carry them out, by node."""

    escalated: tuple[str, ...]
    waiting: tuple[str, ...]
    reason: str
    """The first episode's message: what is missing and where to set it."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({*self.escalated, *self.waiting}))


def no_executor(
    episodes: Sequence[Episode], resolved_at: datetime | None = None
) -> NoExecutor | None:
    """Unresolved ``NoExecutor`` episodes: escalated, or waiting in Pending (None: none);
    ``resolved_at``: an operator resolved the incident then, and episodes detected before it
    no longer count."""
    escalated, waiting, reasons = set(), set(), []
    for ep in sorted(episodes, key=lambda e: (e.spec.fault.detected_at, e.name)):
        if ep.status.reason != NO_EXECUTOR:
            continue
        if resolved_at is not None and ep.spec.fault.detected_at <= resolved_at:
            continue
        if ep.phase is Phase.ESCALATED:
            escalated.add(ep.node)
        elif ep.phase is Phase.PENDING:
            waiting.add(ep.node)
        else:
            continue
        reasons.append(ep.status.message)
    if not reasons:
        return None
    return NoExecutor(tuple(sorted(escalated)), tuple(sorted(waiting)), reasons[0])


class CapabilityWatch:
    def __init__(
        self,
        book: IncidentBook,
        episodes: Callable[[], list[Episode]],
        *,
        clock: Clock,
        interval_s: float,
    ) -> None:
        self.book = book
        self._episodes = episodes
        self._clock = clock
        self._interval_s = interval_s
        self._resolved_at: datetime | None = None
        """When an operator last resolved the incident."""

    def check(self) -> NoExecutor | None:
        """One pass: the incident opened, updated or closed to match the episodes."""
        found = no_executor(self._episodes(), self._resolved_at)
        now = self._clock.now()
        open_ = self.book.find("capability", KEY)
        if found is None:
            if open_ is not None:
                self.book.close(open_.id, now, reason="no episode waits on an agent's settings")
            return None
        if open_ is None:
            log.warning(
                "remediation-capability-missing", nodes=len(found.nodes), reason=found.reason
            )
        self.book.open(
            "capability",
            KEY,
            subjects=Subjects(nodes=found.nodes[:MAX_NODES]),
            decision=DECISION,
            reason=f"agents cannot carry out remediation: {found.reason}",
            now=now,
            evidence={
                "nodes": len(found.nodes),
                "escalated": len(found.escalated),
                "waiting": len(found.waiting),
            },
        )
        return found

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        """An operator resolved the incident: it closes, and the episodes detected before
        this moment stop counting."""
        self._resolved_at = self._clock.now()
        self.book.close(incident.id, self._resolved_at, reason=resolution(action))

    def adopt(self, incidents: Sequence[Incident]) -> None:
        """A new leader takes the last applied resolution's time over."""
        for i in incidents:
            seen = i.observed.resolved
            if (
                i.kind == "capability"
                and seen is not None
                and seen.applied
                and (self._resolved_at is None or seen.seen_at > self._resolved_at)
            ):
                self._resolved_at = seen.seen_at

    async def run(self) -> None:
        """The named task ``capability-incidents``."""
        while True:
            await self._clock.sleep(self._interval_s)
            self.check()
