"""GPUIncident objects: a watch-fed cache on every replica, and the writes the leader makes.

A thin sink over the controller's one LIST+WATCH
(:class:`~gpuhealth.controller.kube.informer.Informer`: 410 Gone relists, other failures back
off and resume; without the CRD the collection is empty and listed again later). An object that
is not a valid GPUIncident (written by hand past the schema, another version) is skipped,
logged and counted, never acted on.

Writes (the leader's, :mod:`gpuhealth.controller.incidents.mirror`): create (name and labels,
an empty spec), the status through the status subresource with ``PUT`` carrying the
``resourceVersion`` (a concurrent writer, on-call's lifecycle edit among them, makes it fail
with 409: :class:`ConflictError`, re-read and written again), the labels by a merge patch
guarded the same way, and delete with the resourceVersion as a precondition (an incident that
opened again meanwhile is not deleted). On-call's command patches ``spec.lifecycle`` with its
own credentials (:func:`patch_lifecycle`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.incidents.lifecycle import ActionName, OnCallAction
from gpuhealth.controller.incidents.resource import (
    GROUP,
    PLURAL,
    VERSION,
    IncidentStatus,
    InvalidIncident,
    StoredIncident,
    lifecycle_patch,
    status_object,
    stored_incident,
)
from gpuhealth.controller.kube.informer import EventType, Informer, newer
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ApiClient,
    ConflictError,
    NotFoundError,
    list_pages,
    request,
)
from gpuhealth.controller.kube.settings import WatchSettings

log = get_logger("kube.gpuincidents")

PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
Listener = Callable[[str], None]
LIST_TIMEOUT_S = 60.0
"""Deadline of one page of the adoption's LIST."""


class GPUIncidentStore:
    def __init__(
        self,
        api: ApiClient,
        settings: WatchSettings | None = None,
        *,
        timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self._timeout = timeout_s
        self._settings = settings or WatchSettings()
        self._items: dict[str, StoredIncident] = {}
        self._listeners: list[Listener] = []
        self.invalid = 0
        """Objects skipped because they are not valid GPUIncidents."""
        self.informer = Informer(
            api,
            PATH,
            self,
            settings=settings,
            clock=clock or SystemClock(),
            what=PLURAL,
            absent_ok=True,
        )

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        await self.informer.run()

    # -- reads (the cache) ------------------------------------------------------------------

    def items(self) -> list[StoredIncident]:
        return list(self._items.values())

    def get(self, name: str) -> StoredIncident | None:
        return self._items.get(name)

    def subscribe(self, listener: Listener) -> None:
        """``listener(name)`` after every change of an object (added, modified, deleted)."""
        self._listeners.append(listener)

    def _put(self, item: StoredIncident) -> None:
        old = self._items.get(item.name)
        if old is not None and not newer(item.resource_version, old.resource_version):
            return
        self._items[item.name] = item
        self._emit(item.name)

    def _forget(self, name: str) -> None:
        if self._items.pop(name, None) is not None:
            self._emit(name)

    def _emit(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:
                log.exception("gpuincident_listener_failed", incident=name)

    def _parse(self, obj: Mapping[str, Any]) -> StoredIncident | None:
        try:
            return stored_incident(obj)
        except InvalidIncident as exc:
            self.invalid += 1
            log.warning("gpuincident_invalid", error=str(exc))
            return None

    async def list_now(self) -> list[StoredIncident]:
        """A fresh LIST (a new leader's adoption: not the watch's view, which may lag), its
        objects recorded in the cache. A 404 (no CRD) is nothing stored; every other error is
        raised (:class:`~gpuhealth.controller.kube.rest.KubeError`)."""
        out: dict[str, StoredIncident] = {}
        try:
            async for page in list_pages(
                self._api,
                PATH,
                limit=self._settings.list_page_size,
                timeout_s=LIST_TIMEOUT_S,
            ):
                if page.restarted:
                    out = {}
                for obj in page.items:
                    item = self._parse(obj)
                    if item is not None:
                        out[item.name] = item
        except NotFoundError:
            return []
        for item in out.values():
            self._put(item)
        return list(out.values())

    # -- writes -----------------------------------------------------------------------------

    async def fetch(self, name: str) -> StoredIncident | None:
        """A fresh GET (bypassing the cache), recorded in the cache."""
        try:
            obj = await request(self._api, "GET", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except NotFoundError:
            self._forget(name)
            return None
        item = self._parse(obj)
        if item is not None:
            self._put(item)
        return item

    async def create(self, body: dict[str, Any]) -> StoredIncident | None:
        """Create the object; an existing one of that name (409) is read instead."""
        try:
            obj = await request(self._api, "POST", PATH, body=body, timeout_s=self._timeout)
        except ConflictError:
            return await self.fetch(str(body["metadata"]["name"]))
        item = self._parse(obj)
        if item is not None:
            self._put(item)
        return item

    async def write_status(self, item: StoredIncident, status: IncidentStatus) -> StoredIncident:
        obj = await request(
            self._api,
            "PUT",
            f"{PATH}/{quote(item.name)}/status",
            body=status_object(item.name, item.resource_version, status),
            timeout_s=self._timeout,
        )
        new = self._parse(obj)
        if new is None:
            raise InvalidIncident(f"GPUIncident {item.name}: the API server returned junk")
        self._put(new)
        return new

    async def write_labels(self, item: StoredIncident, labels: Mapping[str, str]) -> None:
        body = {"metadata": {"resourceVersion": item.resource_version, "labels": dict(labels)}}
        obj = await request(
            self._api,
            "PATCH",
            f"{PATH}/{quote(item.name)}",
            body=body,
            content_type=MERGE_PATCH,
            timeout_s=self._timeout,
        )
        new = self._parse(obj)
        if new is not None:
            self._put(new)

    async def delete(self, item: StoredIncident) -> None:
        """Delete the object as it was read (precondition: its resourceVersion)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": item.resource_version},
        }
        with contextlib.suppress(NotFoundError):
            await request(
                self._api,
                "DELETE",
                f"{PATH}/{quote(item.name)}",
                body=body,
                timeout_s=self._timeout,
            )
        self._forget(item.name)

    # -- the informer's sink --------------------------------------------------------------------

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            item = self._parse(obj)
            if item is not None:
                seen.add(item.name)
                if self._items.get(item.name) != item:
                    self._items[item.name] = item
                    self._emit(item.name)

    def list_complete(self, seen: set[str]) -> None:
        for name in [n for n in self._items if n not in seen]:
            del self._items[name]
            self._emit(name)

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        if event == "DELETED":
            self._forget(str((obj.get("metadata") or {}).get("name", "")))
            return
        item = self._parse(obj)
        if item is not None:
            self._put(item)


async def patch_lifecycle(
    api: ApiClient, name: str, action: ActionName, value: OnCallAction, *, timeout_s: float
) -> StoredIncident:
    """On-call's command: set one lifecycle action of incident ``name`` (merge patch of
    ``spec.lifecycle``) with the caller's credentials; the API server checks RBAC and the
    admission policy (``by`` must be the caller)."""
    obj = await request(
        api,
        "PATCH",
        f"{PATH}/{quote(name)}",
        body=lifecycle_patch(action, value),
        content_type=MERGE_PATCH,
        timeout_s=timeout_s,
    )
    return stored_incident(obj)


async def list_incidents(api: ApiClient, *, timeout_s: float) -> list[StoredIncident]:
    """Every GPUIncident (on-call's ``incident list``; objects that do not parse are left
    out)."""
    out: list[StoredIncident] = []
    async for page in list_pages(api, PATH, limit=500, timeout_s=timeout_s):
        if page.restarted:
            out = []
        for obj in page.items:
            try:
                out.append(stored_incident(obj))
            except InvalidIncident:
                continue
    return out
