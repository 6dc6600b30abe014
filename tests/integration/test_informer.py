"""The controller's one LIST+WATCH (:mod:`gpuhealth.controller.kube.informer`) against the real API
server: a resourceVersion compacted away is answered 410 Gone, and the informer relists and
goes on watching; a LIST comes in pages with the event loop free between them, and what it
did not name is gone only once it is complete; a continue token compacted away mid-LIST
starts it again, whole; a collection that does not exist (no CRD) is empty, synced, and
listed again after the backoff."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.informer import EventType, Informer
from gpuhealth.controller.kube.rest import list_pages, request
from gpuhealth.controller.kube.settings import WatchSettings
from localkube import ControlPlane, ControlPlaneSettings
from tests.support.ticks import Ticks
from tests.support.wait import until

pytestmark = pytest.mark.integration


class Recorder:
    """A sink that keeps the collection by name, as the informer's users do."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.replaced = 0
        self.pages: list[int] = []
        self.events: list[tuple[EventType, str]] = []
        self.on_page: Callable[[], None] = lambda: None

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        self.pages.append(len(items))
        for i in items:
            seen.add(i["metadata"]["name"])
            self.items[i["metadata"]["name"]] = i
        self.on_page()

    def list_complete(self, seen: set[str]) -> None:
        self.replaced += 1
        for name in [n for n in self.items if n not in seen]:
            del self.items[name]

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.events.append((event, name))
        if event == "DELETED":
            self.items.pop(name, None)
        else:
            self.items[name] = obj


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[None]:
    task = asyncio.create_task(informer.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _config_map(api: Any, name: str, labels: dict[str, str]) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}}
    return await request(api, "POST", "/api/v1/namespaces/default/configmaps", body=body)


def _config_maps(api: Any, sink: Recorder, selector: str, settings: WatchSettings) -> Informer:
    """The informer over the default namespace's ConfigMaps that match ``selector``."""
    return Informer(
        api,
        "/api/v1/namespaces/default/configmaps",
        sink,
        query=[("labelSelector", selector)],
        settings=settings,
        what="configmaps",
    )


UNCACHED = ControlPlaneSettings(extra_apiserver_args=("--watch-cache=false",))
"""A control plane without the API server's watch cache: watches and LISTs reach etcd, and
an etcd compaction makes an old revision unavailable."""


def _etcd(cp: ControlPlane, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One call to etcd's JSON gateway, blocking (from inside a sink, between two pages)."""
    req = urllib.request.Request(
        f"{cp.etcd_url}{path}",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


async def test_a_compacted_resource_version_is_gone_and_the_informer_relists(
    kube_assets: Path,
) -> None:
    async with ControlPlane(kube_assets, UNCACHED) as cp:
        api = await make_api_client(str(cp.kubeconfig))
        try:
            mine = {"informer-test": "yes"}
            old = (await _config_map(api, "before", mine))["metadata"]["resourceVersion"]
            last = ""
            for i in range(3):
                last = (await _config_map(api, f"more-{i}", mine))["metadata"]["resourceVersion"]
            _etcd(cp, "/v3/kv/compaction", {"revision": last, "physical": True})
            sink = Recorder()
            informer = _config_maps(
                api, sink, "informer-test=yes", WatchSettings(relist_backoff_s=0.1)
            )
            informer.resume_from(old)
            async with running(informer):
                await asyncio.wait_for(informer.synced.wait(), 15)
                assert informer.relists == 1 and sink.replaced == 1
                assert set(sink.items) == {"before", "more-0", "more-1", "more-2"}
                listed_at = int(informer.resource_version)
                await _config_map(api, "after", mine)
                await _config_map(api, "not-mine", {})
                await until(lambda: "after" in sink.items, "the watch to deliver the new one")
                assert ("ADDED", "after") in sink.events
                assert "not-mine" not in sink.items  # the query holds for the watch too
                assert int(informer.resource_version) > listed_at
                assert informer.relists == 1  # the watch went on from the list
        finally:
            await api.close()


async def test_a_list_comes_in_pages_and_what_it_missed_is_gone_at_its_end(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    label = unique_name("paged")
    names = {f"{label}-{i}" for i in range(7)}
    for name in names:
        await _config_map(api_client, name, {"paged": label})
    sink = Recorder()
    sink.items["deleted-while-away"] = {}
    at_page: list[tuple[int, bool]] = []
    informer = _config_maps(api_client, sink, f"paged={label}", WatchSettings(list_page_size=3))
    async with Ticks() as ticks:
        sink.on_page = lambda: at_page.append((ticks.n, "deleted-while-away" in sink.items))
        await informer.relist()
    assert sink.pages == [3, 3, 1]
    assert set(sink.items) == names  # the one it did not name is gone, once complete
    assert [present for _, present in at_page] == [True, True, True]
    seen_ticks = [t for t, _ in at_page]
    assert all(b > a for a, b in itertools.pairwise(seen_ticks))  # loop ran
    assert sink.replaced == 1 and informer.relists == 1 and informer.synced.is_set()
    assert int(informer.resource_version) > 0


async def test_the_one_paged_list_pages_a_selected_collection(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    """The paged LIST the informer and the uninstall cleanup share: the selector holds on
    every page, each page comes before the next is asked for, one snapshot for all."""
    label = unique_name("pages")
    for i in range(5):
        await _config_map(api_client, f"{label}-{i}", {"pages": label})
    await _config_map(api_client, f"{label}-other", {"pages": "other"})
    pages = [
        page
        async for page in list_pages(
            api_client,
            "/api/v1/namespaces/default/configmaps",
            query=[("labelSelector", f"pages={label}")],
            limit=2,
            timeout_s=10,
        )
    ]
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert {i["metadata"]["name"] for p in pages for i in p.items} == {
        f"{label}-{i}" for i in range(5)
    }
    assert len({p.resource_version for p in pages}) == 1 and pages[0].resource_version
    assert not any(p.restarted for p in pages)


async def test_a_continue_token_compacted_away_lists_again_whole(kube_assets: Path) -> None:
    """etcd compacts past the LIST's snapshot between its first and second page: the API
    server answers the continue token 410 Gone, and the informer lists again in one answer."""
    async with ControlPlane(kube_assets, UNCACHED) as cp:
        api = await make_api_client(str(cp.kubeconfig))
        try:
            for i in range(5):
                await _config_map(api, f"cm-{i}", {"continue-test": "yes"})
            sink = Recorder()

            def compact_after_the_first_page() -> None:
                if len(sink.pages) == 1:
                    key = base64.b64encode(b"/informer-test/bump").decode()
                    put = _etcd(cp, "/v3/kv/put", {"key": key, "value": key})
                    revision = int(put["header"]["revision"])
                    _etcd(cp, "/v3/kv/compaction", {"revision": revision, "physical": True})

            sink.on_page = compact_after_the_first_page
            informer = _config_maps(api, sink, "continue-test=yes", WatchSettings(list_page_size=2))
            await informer.relist()
            assert sink.pages == [2, 5]  # one page, then the whole collection at once
            assert set(sink.items) == {f"cm-{i}" for i in range(5)}
            assert sink.replaced == 1 and informer.relists == 1
        finally:
            await api.close()


async def test_an_absent_collection_is_empty_synced_and_listed_again(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    sink = Recorder()
    group = unique_name("absent").replace("-", "")[:40]
    informer = Informer(
        api_client,
        f"/apis/{group}.example.com/v1/things",
        sink,
        settings=WatchSettings(relist_backoff_s=0.05, relist_backoff_max_s=0.2),
        what="things",
        absent_ok=True,
    )
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 15)
        assert sink.items == {} and informer.resource_version == ""
        await until(lambda: informer.relists >= 4, "the informer to list again")
