"""A stand-in for the node watch cache (``gpuhealth.controller.kube.node_cache.NodeCache``): Node
views plus listeners, no API server. The reconciler's tests use the real cache against
kube-apiserver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.controller.kube.node_cache import NodeListener
from gpuhealth.controller.kube.node_view import NodeView


class FakeNodeCache:
    def __init__(self) -> None:
        self._views: dict[str, NodeView] = {}
        self._listeners: list[NodeListener] = []

    def views(self) -> list[NodeView]:
        return list(self._views.values())

    def get(self, name: str) -> NodeView | None:
        return self._views.get(name)

    def subscribe(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def set(
        self,
        name: str,
        *taints: Mapping[str, Any],
        gpus: int = 8,
        labels: Mapping[str, str] | None = None,
    ) -> NodeView:
        """Add or change the Node ``name`` (``gpus``: its GPU capacity) and tell listeners."""
        old = self._views.get(name)
        rv = str(int(old.resource_version) + 1 if old else 1)
        new = NodeView(
            name=name, resource_version=rv, labels=labels or {}, taints=taints, gpus=gpus
        )
        self._views[name] = new
        for listener in self._listeners:
            listener("modified" if old else "added", old, new)
        return new

    def delete(self, name: str) -> None:
        """The Node ``name`` is deleted: listeners hear it."""
        old = self._views.pop(name, None)
        if old is not None:
            for listener in self._listeners:
                listener("deleted", old, None)
