"""Taints of ours removed by hand: override incidents, the reconciler's acknowledgements.

The controller does not fight an operator: when the node watch shows a taint of ours removed
by someone else while the verdict still wants it (the reconciler's rule,
:func:`gpuhealth.controller.taints.plan.hand_removed`), :class:`TaintOverrides` records it as
an incident of kind ``override`` (subjects: the node; the taint; ``by``: the field manager
that last changed the node's taints, best effort; reason "taint removed by hand"), posts a
``TaintAcknowledged`` Event, and the reconciler's plan does not put that exact taint
(``key=value:effect``) back while the incident is open. It is state the controller owns (a
GPUIncident, adopted by a successor), not an annotation the node's own identity could write.

It ends (closed) when the verdict changes (another value or effect is a new verdict, tainted
again) or the node recovers or is deleted; an operator resolving it (``gpuhealth-controller
incident resolve``) ends it too, and the reconciler puts the taint back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.lifecycle import OnCallAction, resolution
from gpuhealth.controller.incidents.model import (
    Incident,
    IncidentBook,
    OverrideDecision,
    Subjects,
)
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.names import EVENT_TAINT_ACKNOWLEDGED
from gpuhealth.controller.taints.policy import Taint

log = get_logger("incidents.overrides")

DECISION = "taint not put back"
REASON = "taint removed by hand while the verdict wanted it"


def override_key(node: str, taint: Taint) -> str:
    return f"{node}/{taint.render()}"


class TaintOverrides:
    """The reconciler's :class:`~gpuhealth.controller.taints.reconciler.Acknowledgements`,
    kept as override incidents in the book."""

    def __init__(
        self,
        book: IncidentBook,
        *,
        clock: Clock,
        enqueue: Callable[[str], None] = lambda _node: None,
        event: Callable[[str, KubeEvent], None] = lambda _node, _ev: None,
    ) -> None:
        self.book = book
        self.clock = clock
        self._enqueue = enqueue
        self._event = event
        self._by_node: dict[str, dict[Taint, str]] = {}
        """Node -> acknowledged taint -> its incident's id."""

    def of(self, node: str) -> frozenset[Taint]:
        return frozenset(self._by_node.get(node, ()))

    def removed_by_hand(self, node: str, taints: frozenset[Taint], by: str) -> None:
        now = self.clock.now()
        for taint in sorted(taints):
            incident = self.book.open(
                "override",
                override_key(node, taint),
                subjects=Subjects(nodes=(node,)),
                decision=DECISION,
                reason=REASON + (f" ({by})" if by else ""),
                now=now,
                override=OverrideDecision(taint, by),
            )
            self._by_node.setdefault(node, {})[taint] = incident.id
            log.warning(
                "taint_removed_by_hand", node=node, taint=taint.render(), by=by, id=incident.id
            )
            self._event(
                node,
                KubeEvent(
                    "Normal",
                    EVENT_TAINT_ACKNOWLEDGED,
                    f"{taint.render()} removed by hand ({by or 'unknown'}); not put back while "
                    f"the verdict holds: GPUIncident {incident.id} (resolve it to put it back)",
                ),
            )

    def settled(self, node: str, taints: frozenset[Taint], why: str) -> None:
        now = self.clock.now()
        acked = self._by_node.get(node, {})
        for taint in taints:
            iid = acked.pop(taint, None)
            if iid is not None:
                self.book.close(iid, now, reason=why)
                log.info("override_ended", node=node, taint=taint.render(), why=why)
        if not acked:
            self._by_node.pop(node, None)

    def adopt(self, incidents: Sequence[Incident]) -> None:
        """A new leader's overrides: the open override incidents."""
        self._by_node = {}
        for i in incidents:
            if i.kind == "override" and i.open and i.override is not None and i.subjects.nodes:
                self._by_node.setdefault(i.subjects.nodes[0], {})[i.override.taint] = i.id

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        """An operator resolved the override: it ends, the taint is put back."""
        if incident.override is None or not incident.subjects.nodes:
            return
        node = incident.subjects.nodes[0]
        self._by_node.get(node, {}).pop(incident.override.taint, None)
        if not self._by_node.get(node):
            self._by_node.pop(node, None)
        self.book.close(incident.id, self.clock.now(), reason=resolution(action))
        self._enqueue(node)
