"""The incident book and the GPUIncident objects, kept in step.

- **Book -> objects, the leader only.** Every change the deciders make (the judge, the domain
  monitor, the unwatched watch, the overrides) reaches the API server: an incident that opens,
  closes or changes its decision is written at once; one whose only change is ``lastSeen``
  (it moves with every report) at most every ``incidents.persist_interval_s``. Each write is
  guarded by the object's resourceVersion (a 409 re-reads it and writes again), asked of the
  write gate's leadership and dry-run check (``may_write``), and retried with the one backoff
  (``incidents.retry_backoff_s``); a write that fails keeps the decision in memory, is counted
  (``gpuhealth_incident_writes_total{result="error"}``) and is tried again. Closed incidents'
  objects are deleted ``closed_retention_s`` after they closed, or beyond ``closed_keep``.
- **Objects -> book, the leader only.** On-call's lifecycle edits come back through the
  watch (:mod:`gpuhealth.controller.incidents.lifecycle`): an acknowledgement or a silence is
  recorded (the incident stops paging), a resolution closes the incident and lifts its
  decision through the decider of its kind (the ``resolvers``: the domain taint goes, the GPU's
  blame is lifted, an override ends and its taint is put back).
- **What people see** (:class:`IncidentsShown`): the book on the leader once it adopted the
  objects, the objects of the watch on every other replica, so that every replica's API,
  status page and metrics show the same incidents.

Only active between a new leader's adoption (:mod:`gpuhealth.controller.incidents.adoption`)
and the end of its term; the write loop is a named leader task (``incident-mirror``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuhealth.common.backoff import Backoff, BackoffPolicy, Rand
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.lifecycle import OnCallAction, observe, resolution
from gpuhealth.controller.incidents.model import (
    KINDS,
    Incident,
    IncidentBook,
    IncidentKind,
)
from gpuhealth.controller.incidents.resource import (
    IncidentStatus,
    StoredIncident,
    labels_of,
    new_object,
    status_of,
)
from gpuhealth.controller.incidents.settings import IncidentSettings
from gpuhealth.controller.kube.rest import ConflictError, KubeError
from gpuhealth.controller.names import Keys

log = get_logger("incidents.mirror")


class IncidentObjects(Protocol):
    """The GPUIncident objects (``GPUIncidentStore``,
    :mod:`gpuhealth.controller.incidents.incident_store`): the watch cache and the leader's
    writes."""

    def items(self) -> list[StoredIncident]: ...

    def get(self, name: str) -> StoredIncident | None: ...

    def subscribe(self, listener: Callable[[str], None]) -> None: ...

    async def list_now(self) -> list[StoredIncident]: ...

    async def fetch(self, name: str) -> StoredIncident | None: ...

    async def create(self, body: dict[str, Any]) -> StoredIncident | None: ...

    async def write_status(
        self, item: StoredIncident, status: IncidentStatus
    ) -> StoredIncident: ...

    async def write_labels(self, item: StoredIncident, labels: Mapping[str, str]) -> None: ...

    async def delete(self, item: StoredIncident) -> None: ...


Resolver = Callable[[Incident, OnCallAction], None]
"""Lifts an open incident's decision and closes it (an operator's resolve)."""

JITTER = 0.2


class MirrorMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.writes = Counter(
            "gpuhealth_incident_writes",
            "Writes of GPUIncident objects by the leader, by operation (create, status, "
            "labels, delete) and result (ok, conflict, error)",
            ["op", "result"],
            registry=registry,
        )
        self.pending = Gauge(
            "gpuhealth_incident_writes_pending",
            "Incidents whose GPUIncident object lags the leader's decision (lastSeen aside)",
            registry=registry,
        )
        self.adoption_failures = Counter(
            "gpuhealth_incident_adoption_failures",
            "LISTs of GPUIncidents that failed while a new leader adopted them (retried)",
            registry=registry,
        )
        self.adopted = Gauge(
            "gpuhealth_incidents_adopted",
            "Incidents restored from GPUIncident objects at this replica's last takeover",
            registry=registry,
        )
        self.adoption_seconds = Gauge(
            "gpuhealth_incident_adoption_seconds",
            "Seconds this replica's last adoption of the GPUIncidents took (LIST, retries "
            "and restoring the deciders)",
            registry=registry,
        )


def _differs(incident: Incident, stored: StoredIncident | None) -> tuple[bool, bool]:
    """(anything differs, only ``lastSeen`` differs) between the decision and its object."""
    want = status_of(incident)
    have = stored.status if stored is not None else None
    if have is None:
        return True, False
    if have == want:
        return False, False
    return True, msgspec.structs.replace(have, last_seen=want.last_seen) == want


class IncidentMirror:
    def __init__(
        self,
        settings: IncidentSettings,
        book: IncidentBook,
        store: IncidentObjects,
        keys: Keys,
        *,
        clock: Clock,
        may_write: Callable[[], bool],
        metrics: MirrorMetrics,
        rand: Rand = random.random,
    ) -> None:
        self.settings = settings
        self.book = book
        self.store = store
        self.keys = keys
        self.clock = clock
        self._may_write = may_write
        self.metrics = metrics
        self.resolvers: dict[IncidentKind, Resolver] = {}
        """Per kind, what lifts the decision of a resolved incident (without one, the
        incident only closes)."""
        self.backoff = Backoff(
            BackoffPolicy(
                initial_s=settings.retry_backoff_s,
                max_s=settings.retry_backoff_max_s,
                jitter=JITTER,
            ),
            rand,
        )
        self.active = False
        """Between this replica's adoption and the end of its term."""
        self.keep: Callable[[Incident], bool] = lambda _incident: True
        """Past one process: whether an incident is this replica's (one of its nodes is in a
        shard it owns now). Others are their owners': not adopted, not expired here."""
        self._op = "status"
        """The write in flight (the failure's metric label)."""
        self._dirty: set[str] = set()
        self._closing: dict[str, Incident] = {}
        """Closed incidents whose close is not written yet (the book may drop a closed one
        beyond ``closed_keep`` before: its object must not stay open)."""
        self._wake = asyncio.Event()
        book.subscribe(self._on_book)
        store.subscribe(self._on_object)

    # -- book -> objects ----------------------------------------------------------------------

    def _on_book(self, change: str, incident: Incident) -> None:
        self._dirty.add(incident.id)
        if change == "closed":
            self._closing[incident.id] = incident
        elif incident.open:
            self._closing.pop(incident.id, None)
        if self.active:
            self._wake.set()

    def activate(self) -> None:
        """A new term, after the adoption: on-call's edits apply, and every incident is
        compared with its object at the first pass."""
        self.active = True
        for item in self.store.items():
            self.apply_lifecycle(item.name)
        self._dirty.update(self.book.ids())
        self._wake.set()

    def deactivate(self) -> None:
        self.active = False

    async def run(self) -> None:
        """The leader task ``incident-mirror``: write what changed at once, ``lastSeen`` and
        the retention every ``persist_interval_s``, until cancelled (the term ends)."""
        interval = self.settings.persist_interval_s
        next_full = self.clock.monotonic() + interval
        try:
            while True:
                full = self.clock.monotonic() >= next_full
                if full:
                    next_full = self.clock.monotonic() + interval
                delay = await self.flush(full=full)
                if delay > 0:
                    await self.clock.sleep(delay)
                    continue
                self._wake.clear()
                if self._dirty and self._may_write():
                    continue  # a conflict re-read, or a change meanwhile: at once
                timeout = max(0.0, next_full - self.clock.monotonic())
                with contextlib.suppress(TimeoutError):
                    await self.clock.wait_for(self._wake.wait(), timeout)
        finally:
            self.deactivate()

    async def flush(self, *, full: bool = False) -> float:
        """One pass: write every changed incident (with ``full``: every ``lastSeen`` too, and
        delete what the retention ends). The pause before the next pass after a failure (0:
        none)."""
        if not self._may_write():
            self._update_pending()
            return 0.0
        ids = sorted((set(self.book.ids()) | set(self._closing)) if full else self._dirty)
        self._dirty.difference_update(ids)
        try:
            for iid in ids:
                try:
                    await self._sync(iid, last_seen=full)
                except ConflictError:
                    self.metrics.writes.labels(self._op, "conflict").inc()
                    await self.store.fetch(iid)
                    self._dirty.add(iid)
            if full:
                await self.expire()
        except KubeError as exc:
            self.metrics.writes.labels(self._op, "error").inc()
            self._dirty.update(ids)
            delay = self.backoff.next_delay()
            log.warning(
                "incident_write_failed",
                op=self._op,
                error=str(exc),
                attempt=self.backoff.attempt,
                retry_in_s=round(delay, 3),
            )
            self._update_pending()
            return delay
        self.backoff.reset()
        self._update_pending()
        return 0.0

    def _decided(self, iid: str) -> Incident | None:
        return self.book.get(iid) or self._closing.get(iid)

    async def _sync(self, iid: str, *, last_seen: bool) -> None:
        incident = self._decided(iid)
        if incident is None:
            return
        stored = self.store.get(iid)
        differs, only_last_seen = _differs(incident, stored)
        if not differs and not incident.open:
            self._closing.pop(iid, None)
        if not differs or (only_last_seen and not last_seen):
            return
        if stored is None:
            if not incident.open and self._expired(incident):
                self._closing.pop(iid, None)
                return
            self._op = "create"
            stored = await self.store.create(new_object(incident, self.keys))
            self.metrics.writes.labels("create", "ok").inc()
            if stored is None:
                return
        labels = labels_of(incident, self.keys)
        if any(stored.labels.get(k) != v for k, v in labels.items()):
            self._op = "labels"
            await self.store.write_labels(stored, labels)
            self.metrics.writes.labels("labels", "ok").inc()
            stored = self.store.get(iid) or stored
        self._op = "status"
        await self.store.write_status(stored, status_of(incident))
        self.metrics.writes.labels("status", "ok").inc()
        if not incident.open:
            self._closing.pop(iid, None)

    def _expired(self, incident: Incident) -> bool:
        closed = incident.closed_at or incident.last_seen
        return self.clock.now() - closed >= timedelta(seconds=self.settings.closed_retention_s)

    async def expire(self) -> None:
        """Delete the objects of closed incidents past ``closed_retention_s``, and the oldest
        beyond ``closed_keep`` (never one the book has open: it opened again)."""
        closed: list[tuple[datetime, StoredIncident]] = []
        for item in self.store.items():
            st = item.status
            mine = self.book.get(item.name)
            if st is None or st.state != "closed" or (mine is not None and mine.open):
                continue
            if (stored := item.incident()) is None or not self.keep(stored):
                continue
            closed.append((st.closed_at or st.last_seen, item))
        closed.sort(key=lambda c: c[0])
        cut = self.clock.now() - timedelta(seconds=self.settings.closed_retention_s)
        beyond = len(closed) - self.settings.closed_keep
        for n, (at, item) in enumerate(closed):
            if at > cut and n >= beyond:
                break
            self._op = "delete"
            await self.store.delete(item)
            self.metrics.writes.labels("delete", "ok").inc()
            self.book.forget(item.name)
            self._closing.pop(item.name, None)
            log.info("incident_object_deleted", incident=item.name, closed_at=at.isoformat())

    def _update_pending(self) -> None:
        """Count the incidents left to write: those still marked (a failed or refused write,
        or not written yet), so a pass costs what changed, not the whole book."""
        n = 0
        for iid in self._dirty | set(self._closing):
            incident = self._decided(iid)
            if incident is None:
                continue
            differs, only_last_seen = _differs(incident, self.store.get(iid))
            if (
                differs
                and not only_last_seen
                and not (not incident.open and self._expired(incident))
            ):
                n += 1
        self.metrics.pending.set(n)

    # -- objects -> book ----------------------------------------------------------------------

    def _on_object(self, name: str) -> None:
        if self.active:
            self.apply_lifecycle(name)

    def apply_lifecycle(self, name: str) -> None:
        """On-call's actions on object ``name`` as the book's: recorded; a new resolution of an
        open incident lifts its decision."""
        item = self.store.get(name)
        incident = self.book.get(name)
        if item is None or incident is None:
            return
        now = self.clock.now()
        observed, new = observe(item.lifecycle, incident.observed, now)
        updated = self.book.set_lifecycle(name, item.lifecycle, observed) or incident
        for action in new:
            act = item.lifecycle.action(action)
            log.info(
                "incident_lifecycle",
                incident=name,
                kind=incident.kind,
                action=action,
                by=act.by if act else "",
                open=incident.open,
            )
        resolved = item.lifecycle.resolved
        if "resolved" in new and resolved is not None and updated.open:
            self.resolve(updated, resolved)

    def resolve(self, incident: Incident, action: OnCallAction) -> None:
        resolver = self.resolvers.get(incident.kind)
        if resolver is not None:
            resolver(incident, action)
        still = self.book.get(incident.id)
        if still is not None and still.open:  # no decider closed it: close it here
            self.book.close(incident.id, self.clock.now(), reason=resolution(action))


class IncidentsShown:
    """What the API, the status page and the metrics read (an ``IncidentReader``): the book
    while the mirror is active (this replica leads and adopted the objects), the objects of
    the watch otherwise."""

    def __init__(self, book: IncidentBook, store: IncidentObjects, mirror: IncidentMirror):
        self._book = book
        self._store = store
        self._mirror = mirror

    def _stored(self) -> list[Incident]:
        return [i for item in self._store.items() if (i := item.incident()) is not None]

    def list(
        self, *, kind: IncidentKind | None = None, include_closed: bool = False
    ) -> list[Incident]:
        if self._mirror.active:
            return self._book.list(kind=kind, include_closed=include_closed)
        found = [i for i in self._stored() if kind is None or i.kind == kind]
        opened = sorted((i for i in found if i.open), key=lambda i: (i.last_seen, i.id))
        out = list(reversed(opened))
        if include_closed:
            closed = sorted(
                (i for i in found if not i.open), key=lambda i: (i.closed_at or i.last_seen, i.id)
            )
            out.extend(reversed(closed))
        return out

    def counts(self) -> dict[IncidentKind, int]:
        if self._mirror.active:
            return self._book.counts()
        out: dict[IncidentKind, int] = dict.fromkeys(KINDS, 0)
        for i in self._stored():
            if i.open:
                out[i.kind] += 1
        return out

    def get(self, iid: str) -> Incident | None:
        if self._mirror.active:
            return self._book.get(iid)
        item = self._store.get(iid)
        return item.incident() if item is not None else None
