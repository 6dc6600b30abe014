"""GPUIncident objects in memory for the incidents' unit tests: what the mirror and the
adoption read and write (``IncidentObjects``), with the API server's behaviour that matters to
them (resourceVersions that move, 409 on a stale one, the status subresource leaving the spec
alone, objects parsed by the product's own ``stored_incident``). The real store against the
real API server is tested in tests/integration/test_incident_*.py."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from gpuhealth.controller.incidents.resource import (
    IncidentStatus,
    StoredIncident,
    stored_incident,
)
from gpuhealth.controller.kube.rest import ConflictError, KubeError, TransientKubeError


class MemoryIncidents:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._items: dict[str, StoredIncident] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._rv = itertools.count(100)
        self.writes: list[tuple[str, str]] = []
        """(op, name) of every write that reached the "API server"."""
        self.fail_next: list[KubeError] = []
        """Errors the next requests raise, in order."""

    # -- reads --------------------------------------------------------------------------------

    def items(self) -> list[StoredIncident]:
        return list(self._items.values())

    def get(self, name: str) -> StoredIncident | None:
        return self._items.get(name)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def _failing(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def _sync(self, name: str) -> StoredIncident | None:
        """The watch delivers the object as stored now."""
        obj = self.objects.get(name)
        if obj is None:
            self._items.pop(name, None)
        else:
            self._items[name] = stored_incident(copy.deepcopy(obj))
        for listener in self._listeners:
            listener(name)
        return self._items.get(name)

    async def list_now(self) -> list[StoredIncident]:
        self._failing()
        for name in list(self.objects):
            self._sync(name)
        return self.items()

    async def fetch(self, name: str) -> StoredIncident | None:
        self._failing()
        return self._sync(name)

    # -- writes ---------------------------------------------------------------------------------

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def _check(self, item: StoredIncident) -> dict[str, Any]:
        obj = self.objects[item.name]
        if obj["metadata"]["resourceVersion"] != item.resource_version:
            raise ConflictError(f"{item.name}: stale resourceVersion", 409)
        return obj

    async def create(self, body: dict[str, Any]) -> StoredIncident | None:
        self._failing()
        name = body["metadata"]["name"]
        if name in self.objects:
            return self._sync(name)
        obj = copy.deepcopy(body)
        self._bump(obj)
        self.objects[name] = obj
        self.writes.append(("create", name))
        return self._sync(name)

    async def write_status(self, item: StoredIncident, status: IncidentStatus) -> StoredIncident:
        self._failing()
        obj = self._check(item)
        obj["status"] = msgspec.to_builtins(status)
        self._bump(obj)
        self.writes.append(("status", item.name))
        new = self._sync(item.name)
        assert new is not None
        return new

    async def write_labels(self, item: StoredIncident, labels: Mapping[str, str]) -> None:
        self._failing()
        obj = self._check(item)
        obj["metadata"].setdefault("labels", {}).update(labels)
        self._bump(obj)
        self.writes.append(("labels", item.name))
        self._sync(item.name)

    async def delete(self, item: StoredIncident) -> None:
        self._failing()
        self._check(item)
        del self.objects[item.name]
        self.writes.append(("delete", item.name))
        self._sync(item.name)

    # -- on-call, by hand -------------------------------------------------------------------------

    def edit_spec(self, name: str, lifecycle: dict[str, Any]) -> None:
        """On-call patches ``spec.lifecycle`` (the watch brings it)."""
        obj = self.objects[name]
        obj.setdefault("spec", {})["lifecycle"] = lifecycle
        self._bump(obj)
        self._sync(name)


def unreachable() -> TransientKubeError:
    return TransientKubeError("GET gpuincidents: HTTP 503", 503)
