"""A watch-fed local cache of Nodes: LIST once, then WATCH; never LIST per event.

A watch answered 410 Gone (its resourceVersion was compacted away) relists and restarts;
any other failure waits ``relist_backoff_s`` and resumes from the last resourceVersion seen
(or relists when that fails too). Listeners hear every change with the old and new view,
which is how the reconciler notices a taint removed by hand and new or deleted nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
import msgspec
from kubernetes_asyncio import client

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.node_view import NodeView, node_view
from gpuhealth.controller.kube.rest import (
    GoneError,
    KubeError,
    TransientKubeError,
    error_for,
    open_request,
    request,
)
from gpuhealth.controller.settings import WatchSettings

log = get_logger("kube.watch")

Change = Literal["added", "modified", "deleted"]
NodeListener = Callable[[Change, NodeView | None, NodeView | None], None]

_decoder = msgspec.json.Decoder()


def newer(a: str, b: str) -> bool:
    """Is resourceVersion ``a`` newer than ``b``? (etcd revisions are integers; opaque
    versions compare as always-newer, which keeps the cache following the server.)"""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return a != b


class NodeCache:
    def __init__(
        self,
        api: client.ApiClient,
        settings: WatchSettings | None = None,
        *,
        gpu_resource: str = "nvidia.com/gpu",
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.settings = settings or WatchSettings()
        self._gpu_resource = gpu_resource
        self._clock = clock or SystemClock()
        self._nodes: dict[str, NodeView] = {}
        self._listeners: list[NodeListener] = []
        self.synced = asyncio.Event()
        self.relists = 0
        self._rv = ""
        """Resume point of the watch; empty = list first."""

    @property
    def resource_version(self) -> str:
        return self._rv

    def resume_from(self, resource_version: str) -> None:
        """Watch from ``resource_version`` without listing first (tests, a warm restart)."""
        self._rv = resource_version

    def subscribe(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def get(self, name: str) -> NodeView | None:
        return self._nodes.get(name)

    def names(self) -> list[str]:
        return list(self._nodes)

    def views(self) -> list[NodeView]:
        return list(self._nodes.values())

    def gpu_node_count(self) -> int:
        return sum(1 for v in self._nodes.values() if v.gpus > 0)

    def update(self, view: NodeView) -> None:
        """Record a node we just wrote (its answer is at least as new as the watch)."""
        old = self._nodes.get(view.name)
        if old is None or newer(view.resource_version, old.resource_version):
            self._apply("modified" if old else "added", view)

    def _apply(self, change: Change, view: NodeView) -> None:
        old = self._nodes.get(view.name)
        if change == "deleted":
            self._nodes.pop(view.name, None)
            self._emit(change, old, None)
            return
        if old is not None and old.resource_version == view.resource_version:
            return
        if old is not None and not newer(view.resource_version, old.resource_version):
            return
        self._nodes[view.name] = view
        self._emit("added" if old is None else "modified", old, view)

    def _emit(self, change: Change, old: NodeView | None, new: NodeView | None) -> None:
        for listener in self._listeners:
            try:
                listener(change, old, new)
            except Exception:
                log.exception("node_listener_failed")

    async def relist(self) -> None:
        data = await request(self._api, "GET", "/api/v1/nodes", timeout_s=60.0)
        self.relists += 1
        seen: set[str] = set()
        for obj in data.get("items") or ():
            view = node_view(obj, self._gpu_resource)
            seen.add(view.name)
            old = self._nodes.get(view.name)
            if old is None or old.resource_version != view.resource_version:
                self._nodes[view.name] = view
                self._emit("added" if old is None else "modified", old, view)
        for name in [n for n in self._nodes if n not in seen]:
            self._apply("deleted", self._nodes[name])
        self._rv = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self.synced.set()

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        need_list = not self._rv
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                await self._watch_once()
            except GoneError:
                log.info("node_watch_gone_relisting", resource_version=self._rv)
                need_list = True
            except (KubeError, TimeoutError, OSError) as exc:
                log.warning("node_watch_failed", error=str(exc))
                need_list = not self._rv
                await self._clock.sleep(self.settings.relist_backoff_s)

    async def _watch_once(self) -> None:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.settings.timeout_s)),
        ]
        if self._rv:
            query.append(("resourceVersion", self._rv))
        resp = await open_request(
            self._api,
            "GET",
            "/api/v1/nodes",
            query=query,
            timeout_s=(10.0, self.settings.timeout_s + 30.0),
        )
        try:
            if resp.status != 200:
                text = (await resp.read())[:500].decode("utf-8", "replace")
                raise error_for(resp.status, f"watch nodes: HTTP {resp.status}: {text}")
            async for line in resp.content:
                if line.strip():
                    self._on_line(line)
        except (aiohttp.ClientError, msgspec.DecodeError) as exc:
            raise TransientKubeError(f"watch nodes: stream broke: {exc}", 0) from exc
        finally:
            resp.release()

    def _on_line(self, line: bytes) -> None:
        event: dict[str, Any] = _decoder.decode(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_for(code, f"watch nodes: {obj.get('message', '')}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:
            self._rv = rv
        if kind == "BOOKMARK":
            return
        view = node_view(obj, self._gpu_resource)
        if kind == "DELETED":
            self._apply("deleted", view)
        elif kind in ("ADDED", "MODIFIED"):
            self._apply("added" if kind == "ADDED" else "modified", view)
