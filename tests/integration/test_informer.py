"""The controller's one LIST+WATCH (:mod:`controller.kube.informer`) against the real API
server: a resourceVersion compacted away is answered 410 Gone, and the informer relists and
goes on watching; a collection that does not exist (no CRD) is empty, synced, and listed
again after the backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.informer import EventType, Informer
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.settings import WatchSettings
from localkube import ControlPlane, ControlPlaneSettings
from tests.support.wait import until

pytestmark = pytest.mark.integration


class Recorder:
    """A sink that keeps the collection by name, as the informer's users do."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.replaced = 0
        self.events: list[tuple[EventType, str]] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.replaced += 1
        self.items = {i["metadata"]["name"]: i for i in items}

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


async def test_a_compacted_resource_version_is_gone_and_the_informer_relists(
    kube_assets: Path,
) -> None:
    """Its own control plane without the API server's watch cache, so that the watch reaches
    etcd, and an etcd compaction makes the old revision unavailable."""
    settings = ControlPlaneSettings(extra_apiserver_args=("--watch-cache=false",))
    async with ControlPlane(kube_assets, settings) as cp:
        api = await make_api_client(str(cp.kubeconfig))
        try:
            mine = {"informer-test": "yes"}
            old = (await _config_map(api, "before", mine))["metadata"]["resourceVersion"]
            last = ""
            for i in range(3):
                last = (await _config_map(api, f"more-{i}", mine))["metadata"]["resourceVersion"]
            async with aiohttp.ClientSession() as s:
                payload = {"revision": last, "physical": True}
                async with s.post(f"{cp.etcd_url}/v3/kv/compaction", json=payload) as resp:
                    assert resp.status == 200, await resp.text()
            sink = Recorder()
            informer = Informer(
                api,
                "/api/v1/namespaces/default/configmaps",
                sink,
                query=[("labelSelector", "informer-test=yes")],
                settings=WatchSettings(relist_backoff_s=0.1),
                what="configmaps",
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
