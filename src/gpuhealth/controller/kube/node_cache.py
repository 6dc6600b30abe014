"""A watch-fed local cache of Nodes: LIST once, then WATCH; never LIST per event.

A thin sink over the controller's one LIST+WATCH
(:class:`~gpuhealth.controller.kube.informer.Informer`: 410 Gone relists, other failures back off
and resume). Listeners hear every change with the old and new view, which is how the reconciler
notices a taint removed by hand and new or deleted nodes.

Past one process the cache holds only the Nodes of the shards this replica owns
(:meth:`NodeCache.rescope`: a label selector). A Node that leaves that part of the fleet (its
shard no longer owned, or relabelled into another) is ``left``, not ``deleted``: it may still
exist, and nothing that follows a deletion (its DeviceTaintRules removed, its override
settled) may follow. A label-selector watch cannot tell the two apart (for a Node that stops
matching, the API server sends DELETED with the Node as it was before the change), so under a
selector every DELETED is ``left``, and whoever scoped the cache asks the API server and tells
a real deletion with :meth:`NodeCache.tell_deleted`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.informer import EventType, Informer, newer
from gpuhealth.controller.kube.node_view import NodeView, WatchedConditions, node_view
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.settings import WatchSettings

log = get_logger("kube.watch")

Change = Literal["added", "modified", "deleted", "left"]
NodeListener = Callable[[Change, NodeView | None, NodeView | None], None]


class NodeCache:
    def __init__(
        self,
        api: ApiClient,
        settings: WatchSettings | None = None,
        *,
        gpu_resource: str = "nvidia.com/gpu",
        clock: Clock | None = None,
        conditions: WatchedConditions | None = None,
    ) -> None:
        """``conditions``: the Node conditions (other than ours) to keep in each view, and
        with which statuses (``gpuhealth.controller.kube.node_view.node_view``)."""
        self._gpu_resource = gpu_resource
        self._watched = conditions
        self._nodes: dict[str, NodeView] = {}
        self._listeners: list[NodeListener] = []
        self._in_scope: Callable[[Mapping[str, str]], bool] | None = None
        """Whether a Node's labels put it in the part of the fleet watched (None: the whole
        fleet)."""
        self.informer = Informer(
            api,
            "/api/v1/nodes",
            self,
            settings=settings,
            clock=clock or SystemClock(),
            what="nodes",
        )

    # -- the informer's ready event and resume point ----------------------------------------

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    @property
    def relists(self) -> int:
        return self.informer.relists

    @property
    def resource_version(self) -> str:
        return self.informer.resource_version

    def resume_from(self, resource_version: str) -> None:
        """Watch from ``resource_version`` without listing first (tests, a warm restart)."""
        self.informer.resume_from(resource_version)

    async def relist(self) -> None:
        await self.informer.relist()

    def rescope(self, selector: str | None, in_scope: Callable[[Mapping[str, str]], bool]) -> None:
        """Watch another part of the fleet: the Nodes of label selector ``selector`` (None:
        none at all), ``in_scope`` telling their labels. Every cached Node outside it has
        ``left`` at once; the caller cancels the running :meth:`run` first and starts it
        again (it lists the new part; a Node not listed has left)."""
        self._in_scope = in_scope
        self.informer.rescope([("labelSelector", selector)] if selector is not None else [])
        for view in list(self._nodes.values()):
            if selector is None or not in_scope(view.labels):
                self._put("left", view)

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        await self.informer.run()

    # -- reads ------------------------------------------------------------------------------

    def subscribe(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def uid(self, name: str) -> str | None:
        """The UID of the Node of this name as watched, or None when it is not known."""
        view = self.get(name)
        return view.uid if view is not None and view.uid else None

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
            self._put("modified" if old else "added", view)

    # -- the informer's sink ----------------------------------------------------------------

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            view = node_view(obj, self._gpu_resource, self._watched)
            seen.add(view.name)
            old = self._nodes.get(view.name)
            if old is None or old.resource_version != view.resource_version:
                self._nodes[view.name] = view
                self._emit("added" if old is None else "modified", old, view)

    def tell_deleted(self, view: NodeView) -> None:
        """A Node that has ``left`` was deleted (its scoper asked the API server): listeners
        hear the deletion."""
        if view.name not in self._nodes:
            self._emit("deleted", view, None)

    def list_complete(self, seen: set[str]) -> None:
        gone: Change = "deleted" if self._in_scope is None else "left"
        for name in [n for n in self._nodes if n not in seen]:
            self._put(gone, self._nodes[name])

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        view = node_view(obj, self._gpu_resource, self._watched)
        if event == "DELETED":
            self._put("deleted" if self._in_scope is None else "left", view)
        else:
            self._put("added" if event == "ADDED" else "modified", view)

    def _put(self, change: Change, view: NodeView) -> None:
        old = self._nodes.get(view.name)
        if change in ("deleted", "left"):
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
