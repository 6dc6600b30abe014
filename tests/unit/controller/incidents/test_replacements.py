"""A replaced node as an incident (``incidents/replacements.py``): opened while the replacement
is under way, closed once the Node is gone; a replacement skipped or failed is none; a replica
that starts after it completed has it among the closed ones."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.replacements import ReplacementIncidents
from gpuhealth.controller.remediation.model import (
    Episode,
    Fault,
    FaultGpu,
    Phase,
    ReplacementState,
    ReplacementStatus,
    Spec,
    initial_status,
)
from tests.support.clock import FakeClock

CLOCK = FakeClock()


def escalated(state: ReplacementState | None) -> Episode:
    fault = Fault(
        fingerprint="fp",
        boot_id="b",
        detected_at=CLOCK.now(),
        gpus=[FaultGpu(uuid="GPU-1", index=0, code="row-remap-failure")],
    )
    st = msgspec.structs.replace(
        initial_status(CLOCK.now()), phase=Phase.ESCALATED, reason="ContactSupport"
    )
    if state is not None:
        st = msgspec.structs.replace(
            st,
            replacement=ReplacementStatus(
                state=state,
                method="nodeclaim",
                pool="gpu-a",
                node_claim="nc-1",
                rma="contact-support",
            ),
        )
    return Episode(
        name="n1-fp",
        spec=Spec(node_name="n1", action="escalate", scope="node", fault=fault),
        status=st,
    )


class Feed:
    def __init__(self) -> None:
        self.eps: dict[str, Episode] = {}
        self.listeners: list[Callable[[str], None]] = []

    def get(self, name: str) -> Episode | None:
        return self.eps.get(name)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)

    def put(self, ep: Episode) -> None:
        self.eps[ep.name] = ep
        for listener in self.listeners:
            listener(ep.name)


def test_a_replacement_opens_then_closes_an_incident() -> None:
    book, feed = IncidentBook(), Feed()
    ReplacementIncidents(book, feed, CLOCK.now)
    feed.put(escalated(None))
    feed.put(escalated("Skipped"))
    feed.put(escalated("Failed"))
    assert book.list(include_closed=True) == []
    feed.put(escalated("Requested"))
    feed.put(escalated("Deleted"))
    (inc,) = book.list(kind="replacement")
    assert inc.subjects.nodes == ("n1",) and inc.subjects.gpus == ("n1/GPU-1",)
    assert "NodeClaim nc-1 deleted" in inc.decision and "RMA contact-support" in inc.reason
    assert book.opened_total["replacement"] == 1
    feed.put(escalated("Completed"))
    assert book.find("replacement", "n1-fp") is None
    (closed,) = book.list(kind="replacement", include_closed=True)
    assert closed.state == "closed" and "is gone" in closed.close_reason
    feed.put(escalated("Completed"))  # seen again (a resync): not reopened
    assert book.opened_total["replacement"] == 1


def test_a_replica_started_after_the_replacement_has_it_closed() -> None:
    book, feed = IncidentBook(), Feed()
    ReplacementIncidents(book, feed, CLOCK.now)
    feed.put(escalated("Completed"))
    (closed,) = book.list(kind="replacement", include_closed=True)
    assert closed.state == "closed"


def test_a_resolved_replacement_is_not_opened_again() -> None:
    """On-call's resolve is final: the episode's next change (the delete answered) does not
    open the incident again."""
    book, feed = IncidentBook(), Feed()
    ReplacementIncidents(book, feed, CLOCK.now)
    feed.put(escalated("Requested"))
    (inc,) = book.list(kind="replacement")
    book.close(inc.id, CLOCK.now(), reason="resolved by on-call")
    feed.put(escalated("Deleted"))
    assert book.list(kind="replacement") == []
    assert book.opened_total["replacement"] == 1
