"""LIST once, then WATCH one collection, for any kind of object (raw dicts).

The loop of :class:`~controller.kube.watch.NodeCache` without the Node specifics: a watch
answered 410 Gone relists; any other failure waits ``relist_backoff_s`` and resumes from the
last resourceVersion (or relists when there is none). The :class:`WatchSink` hears the
complete list after each LIST and every event after it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, Protocol

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
from gpuhealth.controller.settings import WatchSettings

log = get_logger("kube.object_watch")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
LIST_TIMEOUT_S = 60.0
"""Deadline of one LIST."""
CONNECT_TIMEOUT_S = 10.0
"""Deadline to open the watch (the stream itself lasts ``watch.timeout_s``)."""

_decoder = msgspec.json.Decoder()


class WatchSink(Protocol):
    def replace(self, items: list[dict[str, Any]]) -> None:
        """Everything the LIST returned (objects missing from it are gone)."""

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        """One watch event."""


class ObjectWatch:
    def __init__(
        self,
        api: client.ApiClient,
        path: str,
        sink: WatchSink,
        *,
        query: list[tuple[str, str]] | None = None,
        settings: WatchSettings | None = None,
        clock: Clock | None = None,
        what: str = "objects",
    ) -> None:
        self._api = api
        self._path = path
        self._sink = sink
        self._query = list(query or [])
        self.settings = settings or WatchSettings()
        self._clock = clock or SystemClock()
        self._what = what
        self._rv = ""
        self.synced = asyncio.Event()
        self.relists = 0

    async def run(self) -> None:
        """List, then watch forever (errors are retried here; cancel to stop)."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch_once()
            except GoneError:
                log.info("watch_gone_relisting", what=self._what)
                need_list = True
            except (KubeError, TimeoutError, OSError) as exc:
                log.warning("watch_failed", what=self._what, error=str(exc))
                need_list = not self._rv
                await self._clock.sleep(self.settings.relist_backoff_s)

    async def _list(self) -> None:
        data = await request(
            self._api, "GET", self._path, query=self._query, timeout_s=LIST_TIMEOUT_S
        )
        self.relists += 1
        self._rv = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self._sink.replace(list(data.get("items") or ()))
        self.synced.set()

    async def _watch_once(self) -> None:
        query = [
            *self._query,
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.settings.timeout_s)),
        ]
        if self._rv:
            query.append(("resourceVersion", self._rv))
        resp = await open_request(
            self._api,
            "GET",
            self._path,
            query=query,
            timeout_s=(CONNECT_TIMEOUT_S, self.settings.timeout_s + 30.0),
        )
        try:
            if resp.status != 200:
                text = (await resp.read())[:500].decode("utf-8", "replace")
                raise error_for(resp.status, f"watch {self._what}: HTTP {resp.status}: {text}")
            async for line in resp.content:
                if line.strip():
                    self._on_line(line)
        except (aiohttp.ClientError, msgspec.DecodeError) as exc:
            raise TransientKubeError(f"watch {self._what}: stream broke: {exc}", 0) from exc
        finally:
            resp.release()

    def _on_line(self, line: bytes) -> None:
        event: dict[str, Any] = _decoder.decode(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_for(code, f"watch {self._what}: {obj.get('message', '')}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:
            self._rv = rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._sink.apply(kind, obj)
            except Exception:
                log.exception("watch_sink_failed", what=self._what)
