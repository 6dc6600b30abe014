"""GPUIncident objects: a watch-fed cache on every replica, and the writes the leader makes.

The cache is the controller's one cache of its own objects
(:class:`~gpuhealth.controller.kube.object_cache.ObjectCache` over the one LIST+WATCH: 410 Gone
relists, other failures back off and resume; without the CRD the collection is empty and
listed again later). An object that is not a valid GPUIncident (written by hand past the
schema, another version) is skipped, logged and counted, never acted on.

Writes (the leader's, :mod:`gpuhealth.controller.incidents.mirror`): create (name and labels,
an empty spec), the status through the status subresource with ``PUT`` carrying the
``resourceVersion`` (a concurrent writer, on-call's lifecycle edit among them, makes it fail
with 409: :class:`ConflictError`, re-read and written again), the labels by a merge patch
guarded the same way, and delete with the resourceVersion as a precondition (an incident that
opened again meanwhile is not deleted). On-call's command patches ``spec.lifecycle`` with its
own credentials (:func:`patch_lifecycle`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock
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
from gpuhealth.controller.kube.object_cache import CachedResource, ObjectCache
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ApiClient,
    ConflictError,
    NotFoundError,
    list_pages,
    request,
)
from gpuhealth.controller.kube.settings import WatchSettings

PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
LIST_TIMEOUT_S = 60.0
"""Deadline of one page of the adoption's LIST."""


class GPUIncidentStore(CachedResource[StoredIncident]):
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
        self.cache: ObjectCache[StoredIncident] = ObjectCache(
            api, PATH, stored_incident, what=PLURAL, settings=settings, clock=clock
        )

    # -- reads (the cache) ------------------------------------------------------------------

    def items(self) -> list[StoredIncident]:
        return self.cache.items()

    def get(self, name: str) -> StoredIncident | None:
        return self.cache.get(name)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """``listener(name)`` after every change of an object (added, modified, deleted)."""
        self.cache.subscribe(listener)

    async def list_now(self) -> list[StoredIncident]:
        """A fresh LIST (a new leader's adoption: not the watch's view, which may lag), its
        objects recorded in the cache. A 404 is nothing stored only while no LIST of the
        collection has succeeded here (no CRD yet); after one (this replica's watch listed the
        objects) it is no answer about them (a CRD being replaced, an API server restarting)
        and is raised like every other error
        (:class:`~gpuhealth.controller.kube.rest.KubeError`): the adoption retries it."""
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
                    item = self.cache.parse(obj)
                    if item is not None:
                        out[item.name] = item
        except NotFoundError:
            if self.informer.has_listed:
                raise
            return []
        for item in out.values():
            self.cache.record(item)
        return list(out.values())

    # -- writes -----------------------------------------------------------------------------

    async def fetch(self, name: str) -> StoredIncident | None:
        """A fresh GET (bypassing the cache), recorded in the cache."""
        try:
            obj = await request(self._api, "GET", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except NotFoundError:
            self.cache.forget(name)
            return None
        return self._recorded(obj)

    def _recorded(self, obj: Mapping[str, Any]) -> StoredIncident | None:
        item = self.cache.parse(obj)
        if item is not None:
            self.cache.record(item)
        return item

    async def create(self, body: dict[str, Any]) -> StoredIncident | None:
        """Create the object; an existing one of that name (409) is read instead."""
        try:
            obj = await request(self._api, "POST", PATH, body=body, timeout_s=self._timeout)
        except ConflictError:
            return await self.fetch(str(body["metadata"]["name"]))
        return self._recorded(obj)

    async def write_status(self, item: StoredIncident, status: IncidentStatus) -> StoredIncident:
        obj = await request(
            self._api,
            "PUT",
            f"{PATH}/{quote(item.name)}/status",
            body=status_object(item.name, item.resource_version, status),
            timeout_s=self._timeout,
        )
        new = self._recorded(obj)
        if new is None:
            raise InvalidIncident(f"GPUIncident {item.name}: the API server returned junk")
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
        self._recorded(obj)

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
        self.cache.forget(item.name)


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
