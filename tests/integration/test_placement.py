"""The real kube-scheduler with gpuhealth's extender (a real aiohttp server on 127.0.0.1).

Fleet state reaches the extender the production way: protocol messages (Hello, Snapshot,
Event, Heartbeat) into the real :class:`Fleet`, which :class:`PlacementIndex` follows.
Each test uses its own scheduler profile name and a node label only its nodes carry, so
tests sharing the cluster cannot interfere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.placement import (
    ExtenderHandlers,
    ExtenderSettings,
    PlacementIndex,
    extender_app,
)
from gpuhealth.protocol import Condition, GpuTelemetry
from localkube.kwok import Kwok
from localkube.objects import GPU_RESOURCE, create_gpu_node, create_namespace, create_pod, wait_for
from localkube.process import free_port
from localkube.scheduler import Scheduler
from tests.support.protocol import fault, gpu_uuid, heartbeat, hello, snapshot

pytestmark = pytest.mark.integration

WAIT_S = 30.0
SHIPPED_CONFIG = Path(__file__).parents[2] / "deploy" / "scheduler" / "scheduler-config.yaml"


@dataclass
class Extender:
    fleet: Fleet
    index: PlacementIndex
    handlers: ExtenderHandlers
    url: str

    def config(self, *, ignorable: bool = False, cache: bool = True) -> dict[str, object]:
        return extender_config(self.url, ignorable=ignorable, cache=cache)

    def report(
        self,
        node: str,
        gpus: int,
        *,
        temp: float = 50.0,
        sbe: int = 0,
        unhealthy: tuple[int, ...] = (),
    ) -> None:
        """An agent on ``node`` connects, sends a healthy snapshot, then transitions
        ``unhealthy`` GPUs through Events and reports telemetry in a Heartbeat."""
        self.fleet.on_connect(node, hello(node, gpus))
        self.fleet.on_message(node, snapshot(node, gpus))
        xid = Condition(reason="XidError", code="xid-79", severity="unhealthy", xid=79)
        for i in unhealthy:
            self.fleet.on_message(node, fault(node, i, xid))
        telemetry = [
            GpuTelemetry(
                uuid=gpu_uuid(i, node),
                temperature_c=temp,
                slowdown_temperature_c=90.0,
                sbe_recent=sbe,
            )
            for i in range(gpus)
        ]
        self.fleet.on_message(node, heartbeat(node, telemetry=telemetry))


def extender_config(
    url: str,
    *,
    ignorable: bool,
    cache: bool = True,
    ca_file: Path | None = None,
    client_cert: tuple[Path, Path] | None = None,
) -> dict[str, object]:
    """The shipped deploy/scheduler/scheduler-config.yaml entry, pointed at ``url``, with
    ``ignorable`` and ``nodeCacheCapable`` as the test needs (so the snippet is proven). The
    shipped entry speaks HTTPS (the chart's default): with ``ca_file`` it is kept as shipped
    with that CA, without it turned to plain HTTP as for a release without TLS. With
    ``client_cert`` (certificate, key) the scheduler presents it (``tlsConfig.certFile`` and
    ``keyFile``: the controller's ``extender.client_ca_file``, mutual TLS)."""
    shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
    [entry] = shipped["extenders"]
    assert entry["managedResources"] == [{"name": GPU_RESOURCE, "ignoredByScheduler": False}]
    assert entry["enableHTTPS"] is True and entry["urlPrefix"].startswith("https://")
    out = {**entry, "urlPrefix": url, "ignorable": ignorable, "nodeCacheCapable": cache}
    if ca_file is None:
        del out["tlsConfig"]
        out["enableHTTPS"] = False
    else:
        assert url.startswith("https://")
        out["tlsConfig"] = {**entry["tlsConfig"], "caFile": str(ca_file)}
        if client_cert is not None:
            out["tlsConfig"] |= {"certFile": str(client_cert[0]), "keyFile": str(client_cert[1])}
    return out


@pytest.fixture
async def extender() -> AsyncIterator[Extender]:
    fleet = Fleet()
    index = PlacementIndex(fleet)
    handlers = ExtenderHandlers(lambda: index.summaries)
    runner = web.AppRunner(extender_app(handlers), access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield Extender(fleet, index, handlers, f"http://127.0.0.1:{port}/scheduler")
    finally:
        await runner.cleanup()


@dataclass
class Cluster:
    core: client.CoreV1Api
    api: client.ApiClient
    ns: str
    pin: dict[str, str]
    nodes: list[str]

    async def node(self, name: str, gpus: int) -> None:
        await create_gpu_node(self.api, name, gpus=gpus, labels=self.pin)
        self.nodes.append(name)

    async def pod(self, name: str, gpus: int, scheduler: Scheduler) -> None:
        await create_pod(
            self.api,
            self.ns,
            name,
            gpus=gpus,
            node_selector=self.pin,
            scheduler_name=scheduler.scheduler_name,
        )

    async def bound_node(self, pod: str) -> str:
        async def bound() -> str | None:
            p = await self.core.read_namespaced_pod(pod, self.ns)
            return p.spec.node_name or None

        return await wait_for(bound, what=f"{pod} to be bound", timeout_s=WAIT_S)


@pytest.fixture
async def cluster(
    api_client: client.ApiClient, kwok: Kwok, unique_name: Callable[[str], str]
) -> AsyncIterator[Cluster]:
    core = client.CoreV1Api(api_client)
    ns = unique_name("place")
    await create_namespace(api_client, ns)
    c = Cluster(core, api_client, ns, {"gpuhealth.test/pin": ns}, [])
    try:
        yield c
    finally:
        for name in c.nodes:
            await core.delete_node(name)
        await core.delete_namespace(ns)


@pytest.mark.parametrize("cache", [True, False], ids=["NodeNames", "Nodes"])
async def test_pod_avoids_node_with_too_few_healthy_gpus(
    cache: bool,
    extender: Extender,
    cluster: Cluster,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    broken, healthy = unique_name("broken"), unique_name("healthy")
    await cluster.node(broken, 2)
    await cluster.node(healthy, 2)
    # The broken node is otherwise the better one (cool, clean): only the filter keeps the
    # pod off it.
    extender.report(broken, 2, temp=40, unhealthy=(1,))
    extender.report(healthy, 2, temp=84, sbe=30)
    scheduler = kube_scheduler(
        extenders=[extender.config(cache=cache)], scheduler_name=unique_name("sched")
    )
    await cluster.pod("two-gpus", 2, scheduler)
    assert await cluster.bound_node("two-gpus") == healthy

    # A one-GPU pod fits the broken node's healthy GPU, and there it is preferred (cooler).
    await cluster.pod("one-gpu", 1, scheduler)
    assert await cluster.bound_node("one-gpu") == broken
    assert extender.handlers.metrics.requests["filter", "ok"] >= 2


async def test_prefers_the_cooler_cleaner_node(
    extender: Extender,
    cluster: Cluster,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    hot, dirty, best = unique_name("hot"), unique_name("dirty"), unique_name("best")
    for name in (hot, dirty, best):
        await cluster.node(name, 8)
    extender.report(hot, 8, temp=86, sbe=0)
    extender.report(dirty, 8, temp=45, sbe=200)
    extender.report(best, 8, temp=45, sbe=0)
    scores = {h: extender.index.summaries[h].score for h in (hot, dirty, best)}
    assert scores[best] > max(scores[hot], scores[dirty])
    scheduler = kube_scheduler(extenders=[extender.config()], scheduler_name=unique_name("sched"))
    for i in range(3):
        await cluster.pod(f"p{i}", 1, scheduler)
        assert await cluster.bound_node(f"p{i}") == best
    assert extender.handlers.metrics.requests["prioritize", "ok"] >= 3


@pytest.mark.parametrize("ignorable", [True, False])
async def test_extender_down_follows_ignorable(
    ignorable: bool,
    cluster: Cluster,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    node = unique_name("gpu")
    await cluster.node(node, 8)
    down = f"http://127.0.0.1:{free_port()}/scheduler"  # nothing listens there
    scheduler = kube_scheduler(
        extenders=[extender_config(down, ignorable=ignorable)],
        scheduler_name=unique_name("sched"),
    )
    await cluster.pod("job", 1, scheduler)
    if ignorable:
        assert await cluster.bound_node("job") == node
        return

    async def failed() -> Any:
        p = await cluster.core.read_namespaced_pod("job", cluster.ns)
        cond = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
        return cond[0] if cond and cond[0].status == "False" else None

    cond = await wait_for(failed, what="the scheduling failure", timeout_s=WAIT_S)
    assert "connection refused" in cond.message
    assert down in cond.message
    pod = await cluster.core.read_namespaced_pod("job", cluster.ns)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


async def test_http_answers_in_go_field_names(extender: Extender) -> None:
    """The wire shapes, including the Nodes (not nodeCacheCapable) form and bad input."""
    extender.report("n-ok", 2)
    extender.report("n-bad", 2, unhealthy=(0, 1))
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}
    items = [{"metadata": {"name": n}, "status": {"capacity": {}}} for n in ("n-ok", "n-bad")]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{extender.url}/filter", json={"Pod": pod, "Nodes": {"items": items}}
        ) as r:
            assert r.status == 200
            res = msgspec.json.decode(await r.read())
        assert res["Nodes"]["items"] == [items[0]]
        assert list(res["FailedAndUnresolvableNodes"]) == ["n-bad"]
        async with s.post(
            f"{extender.url}/prioritize", json={"Pod": pod, "NodeNames": ["n-ok", "x"]}
        ) as r:
            assert msgspec.json.decode(await r.read()) == [
                {"Host": "n-ok", "Score": extender.index.summaries["n-ok"].score},
                {"Host": "x", "Score": 5},
            ]
        async with s.post(f"{extender.url}/filter", data=b"{not json") as r:
            assert r.status == 200
            assert "invalid ExtenderArgs" in msgspec.json.decode(await r.read())["Error"]
        # Full Node objects for 5,000 nodes: well over aiohttp's default 1 MiB body limit.
        big = [
            {"metadata": {"name": f"n-{i}", "labels": {"pad": "x" * 250}}, "status": {}}
            for i in range(5000)
        ]
        body = msgspec.json.encode({"Pod": pod, "Nodes": {"items": big}})
        assert len(body) > 1 << 20
        async with s.post(f"{extender.url}/filter", data=body) as r:
            res = msgspec.json.decode(await r.read())
            assert len(res["Nodes"]["items"]) == 5000  # unknown nodes pass
    assert extender.handlers.metrics.requests["filter", "bad_request"] == 1

    # A stand-alone app's limit is the extender's own (the controller's middleware applies the
    # same limit to these routes: test_http_routes.py).
    small = ExtenderHandlers(
        lambda: extender.index.summaries, ExtenderSettings(max_body_bytes=1000)
    )
    async with TestClient(TestServer(extender_app(small), host="127.0.0.1")) as c:
        r = await c.post("/scheduler/filter", data=body)
        assert "larger than 1000 bytes" in msgspec.json.decode(await r.read())["Error"]
    assert small.metrics.requests["filter", "bad_request"] == 1
