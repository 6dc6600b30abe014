"""GPURemediation objects: a watch-fed cache for reads, guarded writes to the API server.

Implements the runner's ``EpisodeStore``. LIST once, then WATCH from the list's
resourceVersion (410 Gone relists; other failures wait ``relist_backoff_s`` and resume).
Status is written with PUT on the status subresource carrying ``metadata.resourceVersion``:
a concurrent writer makes it fail with 409 (:class:`ConflictError`) and the runner re-runs
the pass from the newer object. An object that is not a valid GPURemediation (written by
hand past the schema, or by another version) is skipped, logged and counted, never acted on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
from kubernetes_asyncio import client

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import (
    GoneError,
    KubeError,
    TransientKubeError,
    error_for,
    open_request,
    request,
)
from gpuhealth.controller.kube.watch import newer
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
from gpuhealth.controller.settings import WatchSettings

log = get_logger("kube.gpuremediations")

PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
Listener = Callable[[str], None]
_decoder = msgspec.json.Decoder()


class GPURemediationStore:
    def __init__(
        self,
        api: client.ApiClient,
        settings: WatchSettings | None = None,
        *,
        timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.settings = settings or WatchSettings()
        self._timeout = timeout_s
        self._clock = clock or SystemClock()
        self._items: dict[str, Episode] = {}
        self._rv = ""
        self._listeners: list[Listener] = []
        self.synced = asyncio.Event()
        self.invalid = 0
        """Objects skipped because they are not valid GPURemediations."""

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

    # -- list and watch -------------------------------------------------------------------------

    async def relist(self) -> None:
        """LIST every episode. Without the CRD (404) there are none: the cache is empty and
        synced, and the next round lists again."""
        try:
            data = await request(self._api, "GET", PATH, timeout_s=60.0)
        except KubeError as exc:
            if exc.status != 404:
                raise
            data = {}
        seen: set[str] = set()
        for obj in data.get("items") or ():
            ep = self._parse(obj)
            if ep is not None:
                seen.add(ep.name)
                if self._items.get(ep.name) != ep:
                    self._items[ep.name] = ep
                    self._emit(ep.name)
        for name in [n for n in self._items if n not in seen]:
            del self._items[name]
            self._emit(name)
        self._rv = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self.synced.set()

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                if not self._rv:  # no CRD: nothing to watch yet
                    need_list = True
                    await self._clock.sleep(self.settings.relist_backoff_s)
                    continue
                await self._watch_once()
            except GoneError:
                log.info("gpuremediation_watch_gone_relisting", resource_version=self._rv)
                need_list = True
            except (KubeError, TimeoutError, OSError) as exc:
                log.warning("gpuremediation_watch_failed", error=str(exc))
                need_list = not self._rv
                await self._clock.sleep(self.settings.relist_backoff_s)

    async def _watch_once(self) -> None:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.settings.timeout_s)),
            ("resourceVersion", self._rv),
        ]
        resp = await open_request(
            self._api, "GET", PATH, query=query, timeout_s=(10.0, self.settings.timeout_s + 30.0)
        )
        try:
            if resp.status != 200:
                text = (await resp.read())[:500].decode("utf-8", "replace")
                raise error_for(resp.status, f"watch {PLURAL}: HTTP {resp.status}: {text}")
            async for line in resp.content:
                if line.strip():
                    self._on_line(line)
        except (aiohttp.ClientError, msgspec.DecodeError) as exc:
            raise TransientKubeError(f"watch {PLURAL}: stream broke: {exc}", 0) from exc
        finally:
            resp.release()

    def _on_line(self, line: bytes) -> None:
        event: dict[str, Any] = _decoder.decode(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise error_for(int(obj.get("code") or 0), f"watch {PLURAL}: {obj.get('message', '')}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:
            self._rv = rv
        if kind == "BOOKMARK":
            return
        if kind == "DELETED":
            name = str((obj.get("metadata") or {}).get("name", ""))
            if self._items.pop(name, None) is not None:
                self._emit(name)
            return
        ep = self._parse(obj)
        if ep is not None:
            self._put(ep)
