"""The controller's one LIST+WATCH: list a collection once, then watch it from the list's
resourceVersion, for any kind of object (raw dicts).

Every watch-fed cache is a thin :class:`WatchSink` over an :class:`Informer`: the node cache
(:mod:`gpuhealth.controller.kube.node_cache`), the agent pods
(:mod:`gpuhealth.controller.stream.agent_pods`) and the cache of the controller's own objects
(:mod:`gpuhealth.controller.kube.object_cache`: GPURemediations, GPUIncidents). The informer

- LISTs in pages of ``watch.list_page_size`` through the one paged LIST
  (:func:`~gpuhealth.controller.kube.rest.list_pages`: every page from the one snapshot of
  the first; a continue token that expired meanwhile starts the LIST again, whole, as
  client-go's pager does). ``sink.listed`` hears each page as it comes, so a collection of
  19,000 Nodes is decoded and applied a page per turn of the event loop instead of in one go
  (that held the loop 1.2 s); ``sink.list_complete`` then hears which objects the whole LIST
  named, and what it did not name is gone. It sets :attr:`Informer.synced`, the ready event,
  after the first LIST;
- WATCHes from the last resourceVersion seen, with bookmarks (they move the resume point
  without an event) and a server-side timeout (``watch.timeout_s``), after which it resumes;
- relists at once when the watch is answered 410 Gone (the resourceVersion was compacted
  away or is too old);
- on any other failure waits with the project's one backoff (:mod:`gpuhealth.common.backoff`:
  ``watch.relist_backoff_s`` doubling per consecutive failure up to
  ``watch.relist_backoff_max_s``), then resumes from the last resourceVersion, or relists
  when it has none; a successful LIST or a watch event starts the count again;
- with ``absent_ok``, takes a 404 on the LIST (the CRD is not installed) as an empty,
  synced collection and lists again after the backoff — but only before its first
  successful LIST. After that, "not found" is no answer about the collection (a CRD version
  switched off or replaced, an API server restarting before its CRD handlers are up): a 404
  on the LIST or the WATCH keeps every cached object, is counted
  (:attr:`Informer.not_found`, ``gpuhealth_watch_not_found_total{resource}``), logged, and
  retried with the backoff by a LIST; only a LIST that succeeds (or a DELETED event) takes
  an object out of the cache. (A GPURemediation cache emptied by such a 404 released every
  quarantine.) An informer without ``absent_ok`` (the Nodes) never takes a 404 as empty;
- runs until cancelled, as one supervised task of its owner (:mod:`gpuhealth.common.tasks`).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Literal, Protocol

import aiohttp
import msgspec

from gpuhealth.common.backoff import Backoff, BackoffPolicy, Rand
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import (
    ApiClient,
    GoneError,
    KubeError,
    NotFoundError,
    TransientKubeError,
    error_for,
    list_pages,
    open_request,
)
from gpuhealth.controller.kube.settings import WatchSettings

log = get_logger("kube.informer")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
LIST_TIMEOUT_S = 60.0
"""Deadline of one LIST."""
CONNECT_TIMEOUT_S = 10.0
"""Deadline to open the watch (the stream itself lasts ``watch.timeout_s``)."""
STREAM_SLACK_S = 30.0
"""How long past ``watch.timeout_s`` the client waits for the server to end the stream."""
JITTER = 0.2
"""Random spread of the pause after a failure, as a fraction of it (replicas and caches
that failed together do not retry together)."""

_decoder = msgspec.json.Decoder()


def newer(a: str, b: str) -> bool:
    """Is resourceVersion ``a`` newer than ``b``? (etcd revisions are integers; opaque
    versions compare as always-newer, which keeps a cache following the server.)"""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return a != b


class WatchSink(Protocol):
    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        """One page of a LIST: each object as listed; the sink adds each one's key (its
        own: a name, a UID) to ``seen``."""

    def list_complete(self, seen: set[str]) -> None:
        """The LIST is complete: ``seen`` holds the key of every object it named, and the
        sink's objects whose key it lacks are gone."""

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        """One watch event."""


class Informer:
    def __init__(
        self,
        api: ApiClient,
        path: str,
        sink: WatchSink,
        *,
        query: list[tuple[str, str]] | None = None,
        settings: WatchSettings | None = None,
        clock: Clock | None = None,
        what: str = "objects",
        absent_ok: bool = False,
        rand: Rand = random.random,
    ) -> None:
        self._api = api
        self._path = path
        self._sink = sink
        self._query = list(query or [])
        self.settings = settings or WatchSettings()
        self._clock = clock or SystemClock()
        self.what = what
        self._absent_ok = absent_ok
        self._backoff = Backoff(
            BackoffPolicy(
                initial_s=self.settings.relist_backoff_s,
                max_s=max(self.settings.relist_backoff_s, self.settings.relist_backoff_max_s),
                jitter=JITTER,
            ),
            rand,
        )
        self._rv = ""
        """Resume point of the watch; empty = list first."""
        self.synced = asyncio.Event()
        """Set after the first LIST: the sink holds the whole collection."""
        self.relists = 0
        self.has_listed = False
        """A LIST succeeded (not a 404 taken as an absent collection): from now on a 404 is a
        failure that keeps the cache."""
        self.not_found = 0
        """404s on the LIST or the WATCH after the first successful LIST (the cache kept)."""

    @property
    def resource_version(self) -> str:
        return self._rv

    def resume_from(self, resource_version: str) -> None:
        """Watch from ``resource_version`` without listing first (tests, a warm restart)."""
        self._rv = resource_version

    def rescope(self, query: list[tuple[str, str]]) -> None:
        """Select another part of the collection (a new ``labelSelector``): the next
        :meth:`run` lists it afresh, and until it has :attr:`synced` is clear. The caller
        cancels the running :meth:`run` first."""
        self._query = list(query)
        self._rv = ""
        self.has_listed = False
        self.synced.clear()

    async def run(self) -> None:
        """List, then watch forever (errors are retried here; cancel to stop)."""
        need_list = not self._rv
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                if not self._rv:  # absent (no CRD): nothing to watch yet
                    need_list = True
                    await self._clock.sleep(self._backoff.next_delay())
                    continue
                await self._watch_once()
            except GoneError:
                log.info("watch_gone_relisting", what=self.what, resource_version=self._rv)
                need_list = True
            except (KubeError, TimeoutError, OSError) as exc:
                delay = self._backoff.next_delay()
                vanished = isinstance(exc, NotFoundError) and self.has_listed
                if vanished:
                    self.not_found += 1
                log.warning(
                    "watch_not_found_cache_kept" if vanished else "watch_failed",
                    what=self.what,
                    error=str(exc),
                    attempt=self._backoff.attempt,
                    retry_in_s=round(delay, 3),
                )
                need_list = vanished or not self._rv
                await self._clock.sleep(delay)

    async def relist(self) -> None:
        """One LIST, page by page: the sink hears the whole collection, the watch resumes from
        its resourceVersion."""
        seen: set[str] = set()
        resource_version = ""
        try:
            async for page in list_pages(
                self._api,
                self._path,
                query=self._query,
                limit=self.settings.list_page_size,
                timeout_s=LIST_TIMEOUT_S,
            ):
                if page.restarted:
                    log.info("list_continue_expired", what=self.what, listed=len(seen))
                    seen = set()
                self._sink.listed(page.items, seen)
                resource_version = page.resource_version
        except NotFoundError:
            if not self._absent_ok or self.has_listed:
                raise  # a collection listed before does not vanish on a 404: the cache stays
            seen, resource_version = set(), ""  # absent, even after a page: never listed yet
        else:
            self.has_listed = True
        self.relists += 1
        self._sink.list_complete(seen)
        self._rv = resource_version
        if self._rv:
            self._backoff.reset()
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
            timeout_s=(CONNECT_TIMEOUT_S, self.settings.timeout_s + STREAM_SLACK_S),
        )
        try:
            if resp.status != 200:
                text = (await resp.read())[:500].decode("utf-8", "replace")
                raise error_for(resp.status, f"watch {self.what}: HTTP {resp.status}: {text}")
            async for line in resp.content:
                if line.strip():
                    self.on_line(line)
        except (aiohttp.ClientError, msgspec.DecodeError) as exc:
            raise TransientKubeError(f"watch {self.what}: stream broke: {exc}", 0) from exc
        finally:
            resp.release()

    def on_line(self, line: bytes) -> None:
        """One line of the watch stream: an event for the sink, a bookmark, or an error
        (raised as our :class:`~gpuhealth.controller.kube.rest.KubeError`; 410 is ``GoneError``)."""
        event: dict[str, Any] = _decoder.decode(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_for(code, f"watch {self.what}: {obj.get('message', '')}")
        self._backoff.reset()
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:
            self._rv = rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._sink.apply(kind, obj)
            except Exception:
                log.exception("watch_sink_failed", what=self.what)
