"""The status page in headless Chromium: it renders the fleet, and updates after a fault.

The controller's real Fleet, circuit breaker and idle tracker are fed through their own
interfaces (as the stream server and the idle heartbeats would); the page is served by the
real aiohttp routes and runs its real JavaScript. Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.idle import IdleSettings
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.controller.incidents.lifecycle import Lifecycle, OnCallAction, observe
from gpuhealth.controller.incidents.model import IncidentBook, Subjects
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.model import Episode, Fault, Phase, PhaseTimes, Spec, Status
from gpuhealth.controller.status_page import OVERVIEW_PATH, StatusPage, register
from gpuhealth.protocol import AllocationUsage
from tests.integration.chromium_support import dump_dom, screenshot
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import HOT, XID79, gpu_uuid

pytestmark = pytest.mark.integration

PREFIX = "gpuhealth.io"
NODES = [f"gpu-node-{i}" for i in range(8)]


class Site:
    def __init__(self, page: StatusPage, fleet: Fleet, nodes: FakeNodeCache, url: str) -> None:
        self.page, self.fleet, self.nodes, self.url = page, fleet, nodes, url
        self.overview_requests = 0
        self.after_first_overview: list[Callable[[], None]] = []
        """Run once, right after the first overview answer (while the page stays open)."""

    @web.middleware
    async def count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if request.path == OVERVIEW_PATH:
            self.overview_requests += 1
            if self.overview_requests == 1:
                for hook in self.after_first_overview:
                    hook()
        return response


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = FakeNodeCache()
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.25), clock)
    idle = IdleTracker(IdleSettings(window_s=10, evaluate_interval_s=1), clock=clock)
    idle.attach(fleet)
    site: Site | None = None

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        assert site is not None
        return await site.count(request, handler)

    app = web.Application(middlewares=[count])
    page = register(
        app, fleet, keys=Keys(PREFIX), nodes=nodes, breaker=breaker, idle=idle, cache_s=0.0
    )
    for name in NODES:
        nodes.set(name)
        connect(fleet, name, 8)
    # gpu-node-4: a pod holds GPU 6 at 0 % for longer than the window.
    for _ in range(4):
        usage = AllocationUsage(
            namespace="ml-team", pod="idle-notebook", container="main",
            gpu_uuid=gpu_uuid(6, "gpu-node-4"), utilization_ratio=0.0,
        )  # fmt: skip
        idle.observe("gpu-node-4", [usage], {gpu_uuid(6, "gpu-node-4"): "6"})
        clock.advance(5)
    idle.evaluate()
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    site = Site(page, fleet, nodes, f"http://127.0.0.1:{port}/")
    try:
        yield site
    finally:
        await runner.cleanup()


def cells(dom: str) -> dict[tuple[str, int], str]:
    """(node, gpu) -> state, from the grid's data attributes."""
    found = re.findall(r'data-node="([^"]+)" data-gpu="(\d+)" data-state="(\w+)"', dom)
    return {(n, int(g)): s for n, g, s in found}


async def test_page_renders_the_fleet_then_updates_after_a_fault(site: Site) -> None:
    dom = await dump_dom(site.url)
    assert 'data-ok="true"' in dom, "the script never rendered the overview"
    grid = cells(dom)
    assert len(grid) == 64 and set(grid.values()) == {"healthy"}
    assert 'data-idle="true"' in dom and "ml-team/idle-notebook" in dom
    await screenshot(site.url, "status-page-healthy.png")

    # A GPU falls off the bus; the reconciler taints the node; another node runs hot.
    send_transition(site.fleet, "gpu-node-0", 3, "unhealthy", XID79)
    site.nodes.set(
        "gpu-node-0", {"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    )
    send_transition(site.fleet, "gpu-node-2", 2, "degraded", HOT)

    dom = await dump_dom(site.url)
    grid = cells(dom)
    assert grid[("gpu-node-0", 3)] == "unhealthy"
    assert grid[("gpu-node-2", 2)] == "degraded"
    assert sum(1 for s in grid.values() if s == "healthy") == 62
    tip = re.search(r'<td class="gpu state-unhealthy"[^>]*title="([^"]*)"', dom)
    assert tip is not None and "GPU has fallen off the bus" in tip.group(1)
    assert "RESTART_BM" in tip.group(1)
    assert f"{PREFIX}/unhealthy=xid-79:NoSchedule" in dom  # tainted-nodes panel and grid
    assert "tainted gpuhealth.io/unhealthy=xid-79:NoSchedule" in dom  # recent events
    assert "healthy -&gt; unhealthy" in dom
    shot = await screenshot(site.url, "status-page-fault.png")
    assert shot.stat().st_size > 10_000


async def test_open_page_refreshes_by_itself(site: Site) -> None:
    """One page load: the fault happens after its first poll, and its own polling shows it."""
    site.after_first_overview.append(
        lambda: send_transition(site.fleet, "gpu-node-5", 0, "unhealthy", XID79)
    )
    dom = await dump_dom(site.url)
    assert site.overview_requests >= 2, "the page polled only once"
    assert cells(dom)[("gpu-node-5", 0)] == "unhealthy"


async def test_page_shows_an_open_breaker(site: Site) -> None:
    breaker = site.page.breaker
    assert breaker is not None
    for name in ("gpu-node-0", "gpu-node-1", "gpu-node-5"):
        breaker.request(name, 8)  # the limit is 2 of 8: the third trips it
    dom = await dump_dom(site.url)
    assert 'data-open="true"' in dom and "OPEN" in dom and "gpu-node-5" in dom
    assert "2 node(s) newly tainted in the window; limit 2; trips 1" in dom


async def test_overview_json_and_static_files_are_served(site: Site) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(site.url.rstrip("/") + OVERVIEW_PATH) as resp:
            assert resp.status == 200
            doc = await resp.json()
        assert doc["summary"]["nodes"] == 8 and doc["summary"]["gpus"] == 64
        for path, ctype in (("static/app.js", "javascript"), ("static/style.css", "css")):
            async with http.get(site.url + path) as resp:
                assert resp.status == 200 and ctype in resp.headers["Content-Type"]
        async with http.get(site.url + "static/../routes.py") as resp:
            assert resp.status == 404
        async with http.get(site.url) as resp:
            page = await resp.text()
        assert '<script src="/static/app.js">' in page and "http" not in page.split("<body>")[
            1
        ].split("/static/app.js")[0].replace("http-equiv", "")


async def test_page_shows_the_remediation_pipeline(site: Site) -> None:
    dom = await dump_dom(site.url)
    assert "remediation off" in dom

    def episode(node: str, phase: Phase, reason: str, evicted: int) -> Episode:
        now = site.page.clock.now()
        fault = Fault(fingerprint="f" * 16, boot_id="b", detected_at=now, gpus=[])
        return Episode(
            name=f"{node}-ep",
            spec=Spec(node_name=node, action="reset-gpu", scope="gpu", fault=fault),
            status=Status(
                phase=phase,
                reason=reason,
                times=PhaseTimes(detected=now, draining=now, escalated=now),
                evicted_count=evicted,
            ),
        )

    episodes = [
        episode("gpu-node-3", Phase.DRAINING, "Draining", 2),
        episode("gpu-node-6", Phase.ESCALATED, "ValidationFailed", 1),
    ]
    site.page.episodes = lambda: episodes
    dom = await dump_dom(site.url)
    assert 'data-phase="Draining" data-count="1"' in dom
    assert 'data-phase="Escalated" data-count="1"' in dom
    assert 'data-phase="Returned" data-count="0"' in dom
    row = re.search(r'<tr data-episode="gpu-node-6-ep"[^>]*>(.*?)</tr>', dom)
    assert row is not None and "ValidationFailed" in row.group(1) and "Escalated" in row.group(1)
    assert 'data-node="gpu-node-3" data-phase="Draining"' in dom
    await screenshot(site.url, "status-page-remediation.png")


async def test_a_large_fleet_is_grouped_and_filtered() -> None:
    """300 nodes (more than one overview lists) in two pools: the page shows the groups, lists
    at most ``OVERVIEW_NODES`` nodes with the unhealthy ones among them, and a filter in the
    URL (state, pool, reason) lists only the matching nodes."""
    from gpuhealth.controller.status_page.page import OVERVIEW_NODES

    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = FakeNodeCache()
    app = web.Application()
    register(app, fleet, keys=Keys(PREFIX), nodes=nodes, cache_s=0.0)
    for i in range(300):
        name = f"gpu-node-{i}"
        nodes.set(name, labels={"karpenter.sh/nodepool": "pool-a" if i % 2 else "pool-b"})
        connect(fleet, name, 8)
    for i in (7, 151, 299):
        send_transition(fleet, f"gpu-node-{i}", 2, "unhealthy", XID79)
    send_transition(fleet, "gpu-node-8", 1, "degraded", HOT)
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/"
    try:
        dom = await dump_dom(url)
        groups = re.findall(
            r'<tr class="group" data-state="(\w+)" data-pool="([\w-]*)" '
            r'data-reason="([\w-]*)" data-count="(\d+)"',
            dom,
        )
        assert groups == [  # the worst state first
            ("unhealthy", "pool-a", "xid-79", "3"),
            ("degraded", "pool-b", HOT.code, "1"),
            ("healthy", "pool-a", "", "147"),
            ("healthy", "pool-b", "", "149"),
        ]
        listed = {n for n, _ in cells(dom)}
        assert len(listed) == OVERVIEW_NODES
        assert {"gpu-node-7", "gpu-node-151", "gpu-node-299", "gpu-node-8"} <= listed
        assert f'data-shown="{OVERVIEW_NODES}" data-matched="300"' in dom

        dom = await dump_dom(url + "#state=unhealthy&pool=pool-a&reason=xid-79")
        assert {n for n, _ in cells(dom)} == {"gpu-node-7", "gpu-node-151", "gpu-node-299"}
        assert 'data-shown="3" data-matched="3"' in dom
        await screenshot(url + "#state=unhealthy", "status-page-filtered.png")
    finally:
        await runner.cleanup()


async def test_page_shows_who_took_an_incident(site: Site) -> None:
    """An incident acknowledged by on-call says so (and no longer pages); one nobody took pages."""
    book = IncidentBook()
    site.page.incidents = book
    now = site.page.clock.now()
    for key in ("gpu-node-1", "gpu-node-2"):
        book.open(
            "unwatched",
            key,
            subjects=Subjects(nodes=(key,)),
            decision="condition AgentMissing",
            reason="GPU node with no gpuhealth agent",
            now=now,
        )
    taken = book.find("unwatched", "gpu-node-2")
    assert taken is not None
    ack = OnCallAction("alice@example.com", now, "agent rollout in progress")
    observed, _ = observe(Lifecycle(acknowledged=ack), taken.observed, now)
    book.set_lifecycle(taken.id, Lifecycle(acknowledged=ack), observed)
    dom = await dump_dom(site.url)
    rows = dict(re.findall(r'<tr data-incident="([^"]+)"[^>]*data-paging="(\w+)"', dom))
    assert rows == {
        book.find("unwatched", "gpu-node-1").id: "paging",  # type: ignore[union-attr]
        taken.id: "acknowledged",
    }
    assert "acknowledged by alice@example.com" in dom
