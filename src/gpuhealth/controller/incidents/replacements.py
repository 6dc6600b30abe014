"""The replacement of an escalated node as an incident (``replacement:<episode>``).

The remediation loop records a replacement on its GPURemediation
(``gpuhealth.controller.remediation.replacing``); this part reads the episodes (every replica
watches them) and keeps the book in step: an incident opens when the replacement is under way
(the node drained, its NodeClaim or Node deleted) and closes once the replaced Node is gone.
Derived from the stored episodes alone, so every replica, and a restarted one, has the same
record (a replacement completed before the start is opened and closed at once, into the closed
incidents). A closed one is never opened again (an episode is replaced once; on-call's
resolve is final). The leader's mirror writes them as GPUIncident objects like every other
kind; there is no decision to lift on a resolve.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from gpuhealth.controller.incidents.model import IncidentBook, IncidentKind, Subjects, incident_id
from gpuhealth.controller.remediation.model import Episode

KIND: IncidentKind = "replacement"


class EpisodeFeed(Protocol):
    """The GPURemediation watch cache (``remediation/episode_store.py``)."""

    def get(self, name: str) -> Episode | None: ...

    def subscribe(self, listener: Callable[[str], None]) -> None: ...


class ReplacementIncidents:
    def __init__(self, book: IncidentBook, feed: EpisodeFeed, now: Callable[[], datetime]) -> None:
        self.book = book
        self._feed = feed
        self._now = now
        feed.subscribe(self.episode_changed)

    def episode_changed(self, name: str) -> None:
        ep = self._feed.get(name)
        r = ep.status.replacement if ep is not None else None
        if ep is None or r is None or r.state in ("Skipped", "Failed"):
            return
        now = self._now()
        iid = incident_id(KIND, ep.name)
        known = self.book.get(iid)
        if known is not None and not known.open:
            return  # closed already: the node is gone, or on-call resolved it
        what = f"NodeClaim {r.node_claim}" if r.method == "nodeclaim" else "the Node"
        self.book.open(
            KIND,
            ep.name,
            subjects=Subjects(
                nodes=(ep.node,),
                gpus=tuple(f"{ep.node}/{g.uuid}" for g in ep.spec.fault.gpus),
            ),
            decision=f"node replaced: {what} deleted ({r.method}, pool {r.pool})",
            reason=(
                f"escalated ({ep.status.reason}, RMA {r.rma or 'none'}), and node pool {r.pool} "
                f"replaces its escalated nodes; the GPURemediation {ep.name} keeps the record"
            ),
            now=now,
            evidence={"gpus": len(ep.spec.fault.gpus)},
        )
        if r.state == "Completed":
            self.book.close(iid, now, reason=f"the replaced node {ep.node} is gone")
