"""A watch-fed cache of custom objects, parsed, by name: the informer's sink for the
controller's own resources (GPURemediations, GPUIncidents).

Each object the LIST or the watch brings is parsed by the resource's own ``parse`` (a
``ValueError`` for anything that is not a valid object of it: skipped, logged and counted in
:attr:`ObjectCache.invalid`, never acted on) and kept unless the cache has a newer version;
listeners hear the name of every object that changed (added, modified, deleted). The
resource's store adds its writes, recording each answer here (:meth:`ObjectCache.record`), at
least as new as the watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.informer import EventType, Informer, newer
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.settings import WatchSettings

log = get_logger("kube.objects")

Listener = Callable[[str], None]


class NamedObject(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def resource_version(self) -> str: ...


T = TypeVar("T", bound=NamedObject)


class ObjectCache(Generic[T]):
    def __init__(
        self,
        api: ApiClient,
        path: str,
        parse: Callable[[Mapping[str, Any]], T],
        *,
        what: str,
        settings: WatchSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``parse`` raises ``ValueError`` for an object that is not one of the resource's;
        ``what`` names the resource in logs. A collection that does not exist (no CRD) is empty
        and listed again later."""
        self._parse_object = parse
        self.what = what
        self._items: dict[str, T] = {}
        self._listeners: list[Listener] = []
        self.invalid = 0
        """Objects skipped because they are not valid."""
        self.informer = Informer(
            api,
            path,
            self,
            settings=settings,
            clock=clock or SystemClock(),
            what=what,
            absent_ok=True,
        )

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        await self.informer.run()

    # -- reads ---------------------------------------------------------------------------------

    def items(self) -> list[T]:
        return list(self._items.values())

    def get(self, name: str) -> T | None:
        return self._items.get(name)

    def subscribe(self, listener: Listener) -> None:
        """``listener(name)`` after every change of an object (added, modified, deleted)."""
        self._listeners.append(listener)

    def parse(self, obj: Mapping[str, Any]) -> T | None:
        """The object parsed; None (logged, counted) when it is not a valid one."""
        try:
            return self._parse_object(obj)
        except ValueError as exc:
            self.invalid += 1
            log.warning("object_invalid", what=self.what, error=str(exc))
            return None

    # -- what the store wrote or read ------------------------------------------------------------

    def record(self, item: T) -> None:
        """Keep ``item`` unless the cache has a newer version of it."""
        old = self._items.get(item.name)
        if old is not None and not newer(item.resource_version, old.resource_version):
            return
        self._items[item.name] = item
        self._emit(item.name)

    def forget(self, name: str) -> None:
        if self._items.pop(name, None) is not None:
            self._emit(name)

    def _emit(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:
                log.exception("object_listener_failed", what=self.what, object=name)

    # -- the informer's sink ---------------------------------------------------------------------

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            item = self.parse(obj)
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
            self.forget(str((obj.get("metadata") or {}).get("name", "")))
            return
        item = self.parse(obj)
        if item is not None:
            self.record(item)


class CachedResource(Generic[T]):
    """A resource's store over its :class:`ObjectCache`: the reads every replica serves from
    the watch (synced, the invalid count, the informer, the watch task); the subclass adds
    the resource's writes."""

    cache: ObjectCache[T]
    """The watch cache (the controller's one LIST+WATCH)."""

    @property
    def synced(self) -> asyncio.Event:
        return self.cache.synced

    @property
    def invalid(self) -> int:
        """Objects skipped because they are not valid objects of the resource."""
        return self.cache.invalid

    @property
    def informer(self) -> Informer:
        return self.cache.informer

    async def run(self) -> None:
        """List, then watch forever (the supervisor restarts it if it crashes)."""
        await self.cache.run()
