"""The one informer's stream handling, and its LIST+WATCH loop over a fake API server for the
404 rule ("not found" is an empty collection only before the first successful LIST); the loop
itself runs against the real API server in tests/integration/test_informer.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.kube.informer import JITTER, EventType, Informer
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import GoneError, KubeError
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.metrics import WatchCollector
from tests.support.clock import FakeClock, settle


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[EventType, str]] = []
        self.fail = fail

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        raise AssertionError("no LIST here")

    def list_complete(self, seen: set[str]) -> None:
        raise AssertionError("no LIST here")

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        self.events.append((event, obj["metadata"]["name"]))
        if self.fail:
            raise ValueError("a sink bug")


def _informer(sink: Sink) -> Informer:
    return Informer(None, "/api/v1/things", sink, what="things")


def _line(kind: str, name: str, rv: str) -> bytes:
    return (
        f'{{"type":"{kind}","object":{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}}}'
    ).encode()


def test_events_reach_the_sink_and_move_the_resume_point() -> None:
    sink = Sink()
    inf = _informer(sink)
    inf.on_line(_line("ADDED", "a", "10"))
    inf.on_line(_line("MODIFIED", "a", "11"))
    inf.on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"20"}}}')
    assert inf.resource_version == "20"
    inf.on_line(_line("DELETED", "a", "21"))
    assert sink.events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert inf.resource_version == "21"


@pytest.mark.parametrize(("code", "error"), [(410, GoneError), (500, KubeError), (403, KubeError)])
def test_an_error_event_is_our_error(code: int, error: type[Exception]) -> None:
    inf = _informer(Sink())
    inf.resume_from("5")
    line = f'{{"type":"ERROR","object":{{"kind":"Status","code":{code},"message":"x"}}}}'
    with pytest.raises(error):
        inf.on_line(line.encode())
    assert inf.resource_version == "5"


def test_a_failing_sink_does_not_stop_the_watch() -> None:
    sink = Sink(fail=True)
    inf = _informer(sink)
    inf.on_line(_line("ADDED", "a", "10"))
    inf.on_line(_line("ADDED", "b", "11"))
    assert sink.events == [("ADDED", "a"), ("ADDED", "b")] and inf.resource_version == "11"


def test_the_error_backoff_starts_again_after_an_event() -> None:
    inf = Informer(None, "/x", Sink(), what="things", rand=lambda: 0.5)
    first = inf._backoff.next_delay()
    assert inf._backoff.next_delay() == 2 * first
    inf.on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"20"}}}')
    assert inf._backoff.next_delay() == first


# -- "not found" is an empty collection only before the first successful LIST ---------------


class Answer:
    """One answer of the fake API server: a status, a JSON body (a LIST) or watch lines."""

    def __init__(self, status: int, body: dict[str, Any] | None = None, lines: Any = ()) -> None:
        self.status = status
        self._body = json.dumps(body or {"kind": "Status", "code": status}).encode()
        self._lines = [json.dumps(line).encode() + b"\n" for line in lines]

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass

    @property
    def content(self) -> AsyncIterator[bytes]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        for line in self._lines:
            yield line
        await asyncio.Event().wait()  # the watch stays open: nothing more happens


class FakeApi:
    """Answers the informer's requests in order (``call_api``, as kubernetes_asyncio's
    ApiClient is called by ``gpuhealth.controller.kube.rest``); with no answer left, a
    request waits forever. Records ``(LIST|WATCH, path)``."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    async def call_api(self, path: str, method: str, **kw: Any) -> Answer:
        query = dict(kw.get("query_params") or [])
        self.calls.append("WATCH" if query.get("watch") == "true" else "LIST")
        if not self.answers:
            await asyncio.Event().wait()
        return self.answers.pop(0)


def listing(rv: str, *names: str) -> Answer:
    items = [{"metadata": {"name": n, "resourceVersion": rv}} for n in names]
    return Answer(200, {"metadata": {"resourceVersion": rv}, "items": items})


NOT_FOUND = Answer(404)
SETTINGS = WatchSettings(relist_backoff_s=1.0, relist_backoff_max_s=30.0)


class Cache:
    """A sink that keeps the collection by name, as the informer's users do."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for i in items:
            seen.add(i["metadata"]["name"])
            self.items[i["metadata"]["name"]] = i

    def list_complete(self, seen: set[str]) -> None:
        for name in [n for n in self.items if n not in seen]:
            del self.items[name]

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        if event == "DELETED":
            self.items.pop(obj["metadata"]["name"], None)
        else:
            self.items[obj["metadata"]["name"]] = obj


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[None]:
    task = asyncio.create_task(informer.run())
    try:
        await settle()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def things(api: FakeApi, sink: Cache, clock: FakeClock, *, absent_ok: bool) -> Informer:
    """An informer over a custom resource's collection, without jitter."""
    return Informer(
        api,  # type: ignore[arg-type]
        "/apis/example.com/v1/things",
        sink,
        settings=SETTINGS,
        clock=clock,
        what="things",
        absent_ok=absent_ok,
        rand=lambda: 0.5,
    )


def _not_found_metric(informer: Informer) -> float | None:
    registry = CollectorRegistry()
    registry.register(WatchCollector([informer]))
    return registry.get_sample_value("gpuhealth_watch_not_found_total", {"resource": "things"})


@pytest.mark.parametrize("absent_ok", [True, False])
@pytest.mark.parametrize(
    "vanishing",
    [
        NOT_FOUND,  # the WATCH answered 404
        Answer(200, lines=[{"type": "ERROR", "object": {"kind": "Status", "code": 404}}]),
    ],
    ids=["watch-404", "watch-error-event-404"],
)
async def test_a_404_after_the_first_list_keeps_the_cache_and_lists_again_with_backoff(
    absent_ok: bool, vanishing: Answer
) -> None:
    """Listed once (a, b), then the collection answers 404 (a CRD version switched off, an
    API server restarting): nothing leaves the cache, each 404 is counted, and a LIST is
    tried again after the one backoff (1 s, 2 s, 4 s); the LIST that succeeds at last is
    what the cache follows (b deleted meanwhile)."""
    clock = FakeClock()
    api = FakeApi(listing("10", "a", "b"), vanishing, NOT_FOUND, NOT_FOUND, listing("20", "a"))
    sink = Cache()
    informer = things(api, sink, clock, absent_ok=absent_ok)
    async with running(informer):
        assert informer.synced.is_set() and informer.has_listed
        assert api.calls == ["LIST", "WATCH"]
        assert set(sink.items) == {"a", "b"} and informer.not_found == 1
        for delay, count in ((1.0, 2), (2.0, 3)):
            before = len(api.calls)
            await clock.advance_and_settle(delay - 0.01)
            assert len(api.calls) == before  # nothing before the backoff has passed
            await clock.advance_and_settle(0.01)
            assert len(api.calls) == before + 1 and api.calls[-1] == "LIST"
            assert informer.not_found == count
            assert set(sink.items) == {"a", "b"}  # kept through every 404
        assert _not_found_metric(informer) == 3.0
        await clock.advance_and_settle(4.0)
        assert api.calls == ["LIST", "WATCH", "LIST", "LIST", "LIST", "WATCH"]
        assert set(sink.items) == {"a"} and informer.resource_version == "20"
        assert informer._backoff.attempt == 0  # the successful LIST started the count again


async def test_before_the_first_list_a_404_is_an_empty_synced_collection_with_absent_ok() -> None:
    """The CRD is not installed: an empty, synced collection, listed again after the backoff;
    that is no failure (not counted). Once it is installed and listed, the rule above holds."""
    clock = FakeClock()
    api = FakeApi(NOT_FOUND, listing("5", "a"), NOT_FOUND)
    sink = Cache()
    informer = things(api, sink, clock, absent_ok=True)
    async with running(informer):
        assert informer.synced.is_set() and not informer.has_listed and sink.items == {}
        assert informer.not_found == 0 and api.calls == ["LIST"]
        await clock.advance_and_settle(1.0)
        assert informer.has_listed and set(sink.items) == {"a"}
        assert api.calls == ["LIST", "LIST", "WATCH"] and informer.not_found == 1
        assert set(sink.items) == {"a"}


async def test_the_nodes_are_never_absent() -> None:
    """The node cache's informer is not ``absent_ok``: a 404 on its first LIST leaves it
    unsynced (the reconciler waits for it) and is listed again after the backoff."""
    clock = FakeClock()
    api = FakeApi(NOT_FOUND, listing("7"))
    cache = NodeCache(api, SETTINGS, clock=clock)  # type: ignore[arg-type]
    async with running(cache.informer):
        assert not cache.synced.is_set() and api.calls == ["LIST"]
        await clock.advance_and_settle(SETTINGS.relist_backoff_s * (1 + JITTER))
        assert cache.synced.is_set() and api.calls == ["LIST", "LIST", "WATCH"]
        assert cache.informer.not_found == 0


async def test_a_relist_after_410_that_finds_404_keeps_the_cache() -> None:
    """The path that emptied the GPURemediation cache: the watch's resourceVersion is too old
    (410 Gone, as after an API server restart), the informer lists again at once, and the
    LIST answers 404 (the CRD's handlers not up yet): the cache is kept, the LIST retried
    after the backoff, and only its success replaces the collection."""
    clock = FakeClock()
    api = FakeApi(listing("10", "a", "b"), Answer(410), NOT_FOUND, listing("30", "a", "b"))
    sink = Cache()
    informer = things(api, sink, clock, absent_ok=True)
    async with running(informer):
        assert api.calls == ["LIST", "WATCH", "LIST"]
        assert set(sink.items) == {"a", "b"} and informer.not_found == 1
        assert informer.relists == 1  # the 404 was no LIST of the collection
        await clock.advance_and_settle(1.0)
        assert api.calls == ["LIST", "WATCH", "LIST", "LIST", "WATCH"]
        assert set(sink.items) == {"a", "b"} and informer.resource_version == "30"
