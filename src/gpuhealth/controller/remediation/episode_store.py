"""GPURemediation objects: a watch-fed cache for reads, guarded writes to the API server.

Implements the runner's ``EpisodeStore``. A thin sink over the controller's one LIST+WATCH
(:class:`~gpuhealth.controller.kube.informer.Informer`: 410 Gone relists, other failures back off
and resume; without the CRD, before it was ever listed, the collection is empty and listed
again later; a 404 once it was listed keeps every episode cached, so no quarantine is
released on a "not found").
Status is written with PUT on the status subresource carrying ``metadata.resourceVersion``:
a concurrent writer makes it fail with 409 (:class:`ConflictError`) and the runner re-runs
the pass from the newer object. An object that is not a valid GPURemediation (written by
hand past the schema, or by another version) is skipped, logged and counted
(``gpuhealth_remediation_invalid_objects_total``), never acted on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.informer import EventType, Informer, newer
from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.remediation.model import (
    GROUP,
    PLURAL,
    VERSION,
    Episode,
    InvalidEpisode,
    Spec,
    Status,
    episode_body,
    episode_from_api,
    status_body,
)

log = get_logger("kube.gpuremediations")

PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
Listener = Callable[[str], None]


class GPURemediationStore:
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
        self._items: dict[str, Episode] = {}
        self._listeners: list[Listener] = []
        self.invalid = 0
        """Objects skipped because they are not valid GPURemediations."""
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

    def episodes(self) -> list[Episode]:
        return list(self._items.values())

    def get(self, name: str) -> Episode | None:
        return self._items.get(name)

    def subscribe(self, listener: Listener) -> None:
        """``listener(name)`` after every change of an episode (added, modified, deleted)."""
        self._listeners.append(listener)

    def _put(self, ep: Episode) -> None:
        old = self._items.get(ep.name)
        if old is not None and not newer(ep.resource_version, old.resource_version):
            return
        self._items[ep.name] = ep
        self._emit(ep.name)

    def _emit(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:
                log.exception("gpuremediation_listener_failed", episode=name)

    def _parse(self, obj: Mapping[str, Any]) -> Episode | None:
        try:
            return episode_from_api(obj)
        except InvalidEpisode as exc:
            self.invalid += 1
            log.warning("gpuremediation_invalid", error=str(exc))
            return None

    # -- writes -----------------------------------------------------------------------------

    async def fetch(self, name: str) -> Episode | None:
        """A fresh GET (bypassing the cache), recorded in the cache."""
        try:
            obj = await request(self._api, "GET", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        ep = self._parse(obj)
        if ep is not None:
            self._put(ep)
        return ep

    async def create(self, name: str, spec: Spec, labels: Mapping[str, str]) -> Episode | None:
        """Create the episode; None when one of that name exists (the same fault)."""
        body = episode_body(name, spec, labels)
        try:
            obj = await request(self._api, "POST", PATH, body=body, timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status == 409:
                await self.fetch(name)
                return None
            raise
        ep = self._parse(obj)
        if ep is not None:
            self._put(ep)
        return ep

    async def write_status(self, ep: Episode, status: Status) -> Episode:
        obj = await request(
            self._api,
            "PUT",
            f"{PATH}/{quote(ep.name)}/status",
            body=status_body(ep, status),
            timeout_s=self._timeout,
        )
        new = self._parse(obj)
        if new is None:
            raise InvalidEpisode(f"GPURemediation {ep.name}: the API server returned junk")
        self._put(new)
        return new

    async def delete(self, name: str) -> None:
        try:
            await request(self._api, "DELETE", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status != 404:
                raise
        if self._items.pop(name, None) is not None:
            self._emit(name)

    # -- the informer's sink --------------------------------------------------------------------

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            ep = self._parse(obj)
            if ep is not None:
                seen.add(ep.name)
                if self._items.get(ep.name) != ep:
                    self._items[ep.name] = ep
                    self._emit(ep.name)

    def list_complete(self, seen: set[str]) -> None:
        for name in [n for n in self._items if n not in seen]:
            del self._items[name]
            self._emit(name)

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        if event == "DELETED":
            name = str((obj.get("metadata") or {}).get("name", ""))
            if self._items.pop(name, None) is not None:
                self._emit(name)
            return
        ep = self._parse(obj)
        if ep is not None:
            self._put(ep)
