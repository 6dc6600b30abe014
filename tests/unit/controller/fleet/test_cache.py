"""The fleet cache behind /api/v1/fleet and /api/v1/overview: only changed nodes are
re-encoded, the cached document equals the one built at once, pages follow continue tokens
in natural order, filters apply to summaries, answers are compressed, and a refresh yields
to the event loop between chunks."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet import cache as fleet_cache
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.query import FleetFilter, FleetQuery, encode_continue, parse_query
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.fleet.view import build_fleet_view
from gpuhealth.controller.http.api import FLEET_PATH, ApiV1, fleet_json, node_fragment
from gpuhealth.controller.names import Keys
from gpuhealth.protocol import GpuTelemetry
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import HOT, XID79, gpu_uuid, heartbeat, hello
from tests.support.ticks import Ticks

K = Keys("gpuhealth.io")
TAINT = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
POOL = "karpenter.sh/nodepool"


class World:
    def __init__(self, n: int = 8) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(FleetSettings(agent_timeout_s=10), self.clock)
        self.nodes = FakeNodeCache()
        for i in range(n):
            name = f"gpu-node-{i}"
            self.nodes.set(name, labels={POOL: "a" if i % 2 else "b"})
            connect(self.fleet, name, 2)
        self.cache = FleetCache(self.fleet, self.nodes, K, node_fragment, chunk=3)
        breaker = CircuitBreaker(BreakerSettings(), self.clock)
        self.api = ApiV1(
            cache=self.cache,
            breaker_status=breaker.status,
            reset_breaker_and_requeue=list,
            is_leader=lambda: True,
            dry_run=False,
            clock=self.clock,
        )

    def reference(self) -> dict[str, object]:
        view = build_fleet_view(self.fleet, self.nodes.views(), K)
        return fleet_json(
            view, {}, now=self.clock.now(), now_mono=self.clock.monotonic(), leader=True,
            dry_run=False,
        )  # fmt: skip


def test_only_changed_nodes_are_encoded_and_the_document_stays_the_reference() -> None:
    w = World()
    w.cache.refresh_all()
    assert w.cache.encoded == 8
    w.cache.refresh_all()
    assert w.cache.encoded == 8  # nothing changed: nothing encoded

    send_transition(w.fleet, "gpu-node-3", 1, "unhealthy", XID79)
    w.nodes.set("gpu-node-3", TAINT, labels={POOL: "a"})
    hot = GpuTelemetry(uuid=gpu_uuid(0, "gpu-node-5"), temperature_c=91.0)
    w.fleet.on_message("gpu-node-5", heartbeat("gpu-node-5", telemetry=[hot]))
    w.nodes.set("gpu-node-9", gpus=4)  # a GPU node no agent reported for
    w.nodes.set("cpu-node", gpus=0)  # not listed
    doc = w.api.fleet_document()
    assert w.cache.encoded == 8 + 3  # gpu-node-3, -5 and -9 (cpu-node is not listed)
    ref = w.reference()
    assert doc["nodes"] == ref["nodes"] and doc["summary"] == ref["summary"]
    assert [n["name"] for n in doc["nodes"]][-2:] == ["gpu-node-7", "gpu-node-9"]
    assert doc["nodes"][5]["gpus"][0]["telemetry"]["temperature_c"] == 91.0

    w.clock.advance(11)
    w.fleet.check_silent()  # every agent silent: every node re-encoded, unknown
    w.fleet.forget("gpu-node-0")
    w.nodes._views.pop("gpu-node-0")
    doc = w.api.fleet_document()
    ref = w.reference()
    assert doc["nodes"] == ref["nodes"] and doc["summary"] == ref["summary"]
    assert len(w.cache) == 8 and w.cache.node_counts["unknown"] == 8
    assert {n["state"] for n in doc["nodes"]} == {"unknown"}


def test_pages_follow_continue_tokens_in_natural_order() -> None:
    w = World(11)
    everything = [n["name"] for n in w.api.fleet_document()["nodes"]]
    seen: list[str] = []
    params: list[tuple[str, str]] = [("limit", "4")]
    pages = 0
    while True:
        doc = w.api.fleet_document(parse_query(params))
        seen += [n["name"] for n in doc["nodes"]]
        pages += 1
        assert doc["summary"]["nodes"]["healthy"] == 11  # the whole fleet, every page
        if doc["continue"] is None:
            break
        # a node added mid-listing after the page's position is still listed
        if pages == 1:
            w.nodes.set("gpu-node-99")
        params = [("limit", "4"), ("continue", doc["continue"])]
    assert pages == 3
    assert seen == [*everything, "gpu-node-99"]


def test_filters_select_by_state_pool_reason_and_label() -> None:
    w = World()
    send_transition(w.fleet, "gpu-node-3", 1, "unhealthy", XID79)
    send_transition(w.fleet, "gpu-node-4", 0, "degraded", HOT)
    w.cache.refresh_all()

    def names(flt: FleetFilter, limit: int | None = None) -> list[str]:
        return [e.summary.name for e in w.cache.select(FleetQuery(flt, limit)).nodes]

    assert names(FleetFilter(states=frozenset({"unhealthy", "degraded"}))) == [
        "gpu-node-3",
        "gpu-node-4",
    ]
    assert names(FleetFilter(pools=frozenset({"a"}))) == [f"gpu-node-{i}" for i in (1, 3, 5, 7)]
    assert names(FleetFilter(reasons=frozenset({"xid-79"}))) == ["gpu-node-3"]
    assert names(FleetFilter(labels=parse_query([("label", f"{POOL}!=a")]).filter.labels)) == [
        f"gpu-node-{i}" for i in (0, 2, 4, 6)
    ]
    page = w.cache.select(FleetQuery(FleetFilter(pools=frozenset({"a"})), limit=1))
    assert [e.summary.name for e in page.nodes] == ["gpu-node-1"]
    assert page.after == "gpu-node-1"
    last = w.cache.select(FleetQuery(FleetFilter(pools=frozenset({"a"})), 1, after="gpu-node-5"))
    assert [e.summary.name for e in last.nodes] == ["gpu-node-7"] and last.after is None
    assert w.cache.groups == {
        ("unhealthy", "a", "xid-79"): 1,
        ("degraded", "b", HOT.code): 1,
        ("healthy", "a", ""): 3,
        ("healthy", "b", ""): 3,
    }


def test_reasons_of_nodes_without_a_report() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(agent_timeout_s=10), clock)
    nodes = FakeNodeCache()
    nodes.set("no-agent")
    connect(fleet, "silent")
    clock.advance(11)
    fleet.check_silent()
    fleet.on_connect("no-report", hello("no-report", 2))
    cache = FleetCache(fleet, nodes, K, node_fragment)
    cache.refresh_all()
    got = {e.summary.name: (e.summary.state, e.summary.reason) for e in cache.entries()}
    assert got == {
        "no-agent": ("unknown", "no-agent"),
        "no-report": ("unknown", "no-report"),
        "silent": ("unknown", "agent-silent"),
    }


async def test_refresh_yields_to_the_loop_between_chunks() -> None:
    w = World(10)  # chunk=3: 4 chunks
    async with Ticks() as ticks:
        await w.cache.refresh()
    assert w.cache.dirty == 0 and len(w.cache) == 10
    assert ticks.n >= 3  # the other task ran between the chunks


@pytest.mark.parametrize("gzip_ok", [True, False])
async def test_http_fleet_pages_filters_and_compression(gzip_ok: bool) -> None:
    w = World(20)
    send_transition(w.fleet, "gpu-node-13", 1, "unhealthy", XID79)
    app = web.Application()
    app.add_routes(w.api.routes())
    headers = {"Accept-Encoding": "gzip" if gzip_ok else "identity"}
    async with TestClient(TestServer(app)) as c:
        resp = await c.get(FLEET_PATH, headers=headers, auto_decompress=False)
        raw = await resp.read()
        assert resp.status == 200
        assert resp.headers.get("Content-Encoding") == ("gzip" if gzip_ok else None)
        whole = json.loads(gzip.decompress(raw) if gzip_ok else raw)
        assert len(whole["nodes"]) == 20 and whole["continue"] is None
        assert whole["nodes"] == w.reference()["nodes"]

        names: list[str] = []
        token = ""
        while True:
            q = {"limit": "7", **({"continue": token} if token else {})}
            doc = await (await c.get(FLEET_PATH, params=q, headers=headers)).json()
            names += [n["name"] for n in doc["nodes"]]
            token = doc["continue"]
            if not token:
                break
        assert names == [n["name"] for n in whole["nodes"]]

        bad = await c.get(FLEET_PATH, params={"state": "sick"})
        assert bad.status == 400 and "state" in (await bad.json())["error"]
        doc = await (await c.get(FLEET_PATH, params={"state": "unhealthy"})).json()
        assert [n["name"] for n in doc["nodes"]] == ["gpu-node-13"]


@pytest.mark.parametrize(
    "params",
    [
        [],
        [("limit", "3")],
        [("limit", "3"), ("continue", encode_continue("gpu-node-4"))],
        [("pool", "a")],
        [("pool", "a"), ("limit", "2"), ("continue", encode_continue("gpu-node-1"))],
        [("state", "unhealthy")],
        [("continue", encode_continue("gpu-node-10"))],
        [("continue", encode_continue("gpu-node-11"))],  # past the end
    ],
)
async def test_scan_lists_what_select_lists_yielding_between_slices(
    params: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_cache, "SCAN_SLICE", 2)
    w = World(11)
    send_transition(w.fleet, "gpu-node-9", 1, "unhealthy", XID79)
    w.cache.refresh_all()
    query = parse_query(params)
    want = w.cache.select(query)
    sleeps = 0
    real_sleep = asyncio.sleep

    async def counting(delay: float) -> None:
        nonlocal sleeps
        sleeps += 1
        await real_sleep(delay)

    monkeypatch.setattr(fleet_cache.asyncio, "sleep", counting)
    got = await w.cache.scan(query)
    assert [e.summary.name for e in got.nodes] == [e.summary.name for e in want.nodes]
    assert got.after == want.after
    if query.everything:
        assert sleeps >= 5  # 11 nodes, 2 at a time


async def test_heartbeats_cost_only_the_readers_of_those_nodes() -> None:
    """A heartbeat changes telemetry, not what counts, groups and filters read: the overview
    re-encodes nothing for it, and a page re-encodes only its own nodes' fragments."""
    w = World(10)
    w.cache.refresh_all()
    for i in range(10):
        hot = GpuTelemetry(uuid=gpu_uuid(0, f"gpu-node-{i}"), temperature_c=70.0 + i)
        w.fleet.on_message(f"gpu-node-{i}", heartbeat(f"gpu-node-{i}", telemetry=[hot]))
    before = w.cache.encoded
    await w.cache.refresh()
    assert w.cache.encoded == before  # summaries unchanged: nothing to rebuild
    page = await w.cache.scan(parse_query([("limit", "3")]))
    fresh = await w.cache.fresh(page.nodes)
    assert w.cache.encoded == before + 3
    assert [
        json.loads(e.fragment + b"}")["gpus"][0]["telemetry"]["temperature_c"] for e in fresh
    ] == [
        70.0,
        71.0,
        72.0,
    ]
    doc = w.api.fleet_document()
    assert w.cache.encoded == before + 10
    assert doc["nodes"] == w.reference()["nodes"]


def test_the_state_gauges_count_from_the_cache_as_from_the_view() -> None:
    """gpuhealth_nodes / gpuhealth_gpus read the cache's counts (no fleet view built per
    scrape) and say what the view says, after changes the cache has not been asked about."""
    from gpuhealth.controller.metrics import GaugeCollector, GaugeInputs

    w = World()
    w.cache.refresh_all()
    send_transition(w.fleet, "gpu-node-3", 1, "unhealthy", XID79)
    w.nodes.set("gpu-node-9", gpus=4)
    breaker = CircuitBreaker(BreakerSettings(), w.clock)

    def gauges(cache: FleetCache | None) -> dict[tuple[str, str], float]:
        src = GaugeInputs(
            fleet=w.fleet, breaker=breaker, keys=K, is_leader=lambda: True,
            node_views=w.nodes.views, dra_rules=lambda: 0, fleet_cache=cache,
        )  # fmt: skip
        return {
            (fam.name, s.labels["state"]): s.value
            for fam in GaugeCollector(src).collect()
            if fam.name in ("gpuhealth_nodes", "gpuhealth_gpus")
            for s in fam.samples
        }

    with_cache = gauges(w.cache)
    assert with_cache == gauges(None)
    assert with_cache[("gpuhealth_nodes", "unhealthy")] == 1
    assert with_cache[("gpuhealth_nodes", "unknown")] == 1


async def test_a_scrape_refreshes_the_cache_in_slices_first() -> None:
    """``/metrics`` (one synchronous collect) is preceded by the cache's sliced refresh: a
    fleet all dirty after a storm is re-encoded between yields, not inside the scrape."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import CollectorRegistry

    from gpuhealth.controller.http.routes import Probes
    from gpuhealth.controller.metrics import GaugeCollector, GaugeInputs

    w = World(10)  # chunk=3
    registry = CollectorRegistry()
    inputs = GaugeInputs(
        fleet=w.fleet, breaker=CircuitBreaker(BreakerSettings(), w.clock), keys=K,
        is_leader=lambda: True, node_views=w.nodes.views, dra_rules=lambda: 0,
        fleet_cache=w.cache,
    )  # fmt: skip
    GaugeCollector(inputs, registry)
    dirty_at_collect: list[int] = []
    counts = inputs.counts

    def spy() -> tuple[dict[str, int], dict[str, int]]:
        dirty_at_collect.append(w.cache.dirty)
        return counts()

    inputs.counts = spy  # type: ignore[method-assign]
    probes = Probes(
        registry=registry, tasks=None, is_leader=lambda: True, leader_ready=lambda: True,  # type: ignore[arg-type]
        synced=lambda: True,
        before_scrape=w.cache.refresh,
    )  # fmt: skip
    app = web.Application()
    app.add_routes(probes.routes())
    async with TestClient(TestServer(app)) as client:
        assert w.cache.dirty == 10
        async with Ticks() as ticks:
            body = await (await client.get("/metrics")).text()
    assert dirty_at_collect == [0]  # all re-encoded before the synchronous collect
    assert ticks.n >= 3  # and the loop ran other work between the slices
    assert 'gpuhealth_nodes{state="healthy"} 10.0' in body
