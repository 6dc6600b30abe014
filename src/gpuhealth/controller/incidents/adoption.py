"""A new leader takes the incidents over before its first reconcile.

LeaderWork's prepare (:mod:`gpuhealth.controller.leadership.work`) runs :meth:`Adoption.run`
after the breaker's adoption and before the reconciler starts: a fresh LIST of the
GPUIncidents (retried with the one backoff, ``incidents.retry_backoff_s``, while the API server
refuses: 403, 500, timeouts; counted in ``gpuhealth_incident_adoption_failures_total``; a 404
is nothing stored only while this replica's watch has never listed the collection — no CRD
yet —, and retried like the others after that: a CRD being replaced or an API server
restarting must not make a successor adopt nothing), then

1. the book is restored from the objects (:func:`restored`: the stored incidents, and those
   this replica decided itself that no object holds yet);
2. each decider takes its own kind over (``adopters``): the domain monitor its open domains
   (members, the nodes that faulted, admitted or held) and the resolution times of resolved
   ones, the judge its blames (since, until, the condition's message and XID), the unwatched
   watch its unwatched nodes, the overrides the taints removed by hand;
3. the mirror activates: on-call's actions the previous leader had not applied apply now, and
   every incident is compared with its object.

Until then ``/readyz`` answers 503 (the leader work is not ready) and no taint is written: the
reconciler's first pass already knows every domain taint and blame, so a successor never
removes a taint its predecessor's decision holds (issue 38, "positive evidence only").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.mirror import IncidentMirror, IncidentObjects
from gpuhealth.controller.incidents.model import Incident, IncidentBook
from gpuhealth.controller.incidents.resource import StoredIncident
from gpuhealth.controller.kube.rest import KubeError

log = get_logger("incidents.adoption")

Adopter = Callable[[Sequence[Incident]], None]
"""A decider taking over the adopted incidents of its kind (open and closed: a resolved one
says when evidence stops counting)."""


def restored(stored: Sequence[StoredIncident], own: Sequence[Incident]) -> list[Incident]:
    """The book of a new leader: every stored incident (with on-call's actions), and this
    replica's own open incidents that no object holds (decided here, never written)."""
    out = {i.id: i for item in stored if (i := item.incident()) is not None}
    for i in own:
        if i.open and i.id not in out:
            out[i.id] = i
    return list(out.values())


class Adoption:
    def __init__(
        self,
        store: IncidentObjects,
        book: IncidentBook,
        mirror: IncidentMirror,
        *,
        clock: Clock,
        adopters: Sequence[Adopter] = (),
    ) -> None:
        self.store = store
        self.book = book
        self.mirror = mirror
        self.clock = clock
        self.adopters = list(adopters)

    async def run(self) -> None:
        """List (until the API server answers), restore, activate the mirror."""
        t0 = time.perf_counter()
        backoff = self.mirror.backoff
        while True:
            try:
                stored = await self.store.list_now()
                break
            except KubeError as exc:
                self.mirror.metrics.adoption_failures.inc()
                delay = backoff.next_delay()
                log.warning(
                    "incident_adoption_list_failed",
                    error=str(exc),
                    attempt=backoff.attempt,
                    retry_in_s=round(delay, 3),
                )
                await self.clock.sleep(delay)
        backoff.reset()
        own = self.book.list()
        incidents = [i for i in restored(stored, own) if self.mirror.keep(i)]
        self.book.restore(incidents)
        for adopt in self.adopters:
            adopt(incidents)
        self.mirror.activate()
        took = time.perf_counter() - t0
        self.mirror.metrics.adopted.set(len(stored))
        self.mirror.metrics.adoption_seconds.set(took)
        log.info(
            "incidents_adopted",
            objects=len(stored),
            open=sum(1 for i in incidents if i.open),
            took_ms=round(took * 1000, 1),
        )
