"""Fleet-wide reads through any replica past one process (three shards over two or three
replicas, each holding only its shards' nodes; the peers in process): the merged overview
equals the one replica holding every node, a fleet walk pages across shards in order with
``limit`` filled across them, a shard whose owner does not answer is named, a forged token
is a 400, and ``scope=local`` answers only this replica's shards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.fleet.query import encode_continue
from gpuhealth.controller.http.api import FLEET_PATH
from gpuhealth.controller.shards.merge import Walk, encode_walk
from gpuhealth.controller.status_cli import (
    EXIT_INCOMPLETE,
    EXIT_UNHEALTHY,
    exit_code,
    fetch_fleet,
    render_table,
)
from gpuhealth.controller.status_page.page import OVERVIEW_PATH
from gpuhealth.protocol import HealthState
from tests.support.shard_replicas import InProcessPeers, cluster, node_names, replica

NAMES = node_names(30, 3)
STATES: dict[str, HealthState] = {"gpu-node-4": "unhealthy", "gpu-node-17": "degraded"}


async def walk_all(reads: Any, limit: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Every page of the fleet through ``reads``: the node names in order, and the pages."""
    names: list[str] = []
    pages: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(100):
        params = [("limit", str(limit)), *([("continue", token)] if token else [])]
        page = await reads.fleet(params)
        pages.append(page)
        names += [n["name"] for n in page["nodes"]]
        token = page["continue"]
        if token is None:
            return names, pages
    raise AssertionError("the walk did not end")


def shard_order() -> list[str]:
    from gpuhealth.controller.fleet.view import natural_key

    return [n for i in range(3) for n in sorted(NAMES[i], key=natural_key)]


async def test_the_merged_overview_is_the_whole_fleet_through_any_replica() -> None:
    whole = replica({0, 1, 2}, NAMES, STATES)
    expected = await whole.page.overview_for([])
    replicas, _ = cluster([{0, 2}, {1}], NAMES, STATES)
    for r in replicas:
        assert r.reads is not None
        merged = await r.reads.overview([])
        assert merged["summary"] == expected["summary"]
        assert merged["groups"] == expected["groups"]
        assert [n["name"] for n in merged["nodes"]] == [n["name"] for n in expected["nodes"]]
        assert merged["shards"] == {"count": 3, "read": [0, 1, 2], "unavailable": []}
    filtered = await replicas[1].reads.overview([("state", "unhealthy")])  # type: ignore[union-attr]
    assert [n["name"] for n in filtered["nodes"]] == ["gpu-node-4"]
    assert filtered["nodes_matched"] == 1 and filtered["summary"]["nodes"] == 30


async def test_the_own_shards_are_read_locally_and_each_other_owner_once() -> None:
    replicas, peers = cluster([{0}, {1, 2}], NAMES, STATES)
    assert isinstance(peers, InProcessPeers)
    assert replicas[0].reads is not None
    await replicas[0].reads.overview([])
    assert peers.asked == [(1, 2)]  # shard 0 answered here, shards 1 and 2 in one request


@pytest.mark.parametrize("limit", [1, 4, 7, 10, 11, 30, 5000])
async def test_a_fleet_walk_pages_across_the_shards_in_order(limit: int) -> None:
    replicas, _ = cluster([{0, 2}, {1}], NAMES, STATES)
    names, pages = await walk_all(replicas[1].reads, limit)
    assert names == shard_order()
    assert all(len(p["nodes"]) <= limit for p in pages)
    assert all(len(p["nodes"]) == limit for p in pages[:-1])  # limit filled across shards
    assert all(p["shards"]["unavailable"] == [] for p in pages)


async def test_without_limit_one_page_holds_every_shard() -> None:
    replicas, _ = cluster([{0}, {1}, {2}], NAMES, STATES)
    assert replicas[2].reads is not None
    page = await replicas[2].reads.fleet([])
    assert [n["name"] for n in page["nodes"]] == shard_order()
    assert page["continue"] is None
    assert page["summary"]["nodes"]["unhealthy"] == 1
    assert sum(page["summary"]["nodes"].values()) == 30


async def test_a_read_without_limit_is_paged_all_the_same() -> None:
    replicas, _ = cluster([{0}, {1, 2}], NAMES, STATES)
    reads = replicas[0].reads
    assert reads is not None
    reads.page_nodes = 7
    first = await reads.fleet([])
    assert len(first["nodes"]) == 7 and first["continue"] is not None
    names = [n["name"] for n in first["nodes"]]
    token = first["continue"]
    while token is not None:
        page = await reads.fleet([("continue", token)])
        names += [n["name"] for n in page["nodes"]]
        token = page["continue"]
    assert names == shard_order()


async def test_a_filter_applies_in_every_shard() -> None:
    replicas, _ = cluster([{0, 1}, {2}], NAMES, STATES)
    assert replicas[0].reads is not None
    found = []
    token = None
    while True:
        params = [("state", "unhealthy,degraded"), ("limit", "1")]
        page = await replicas[0].reads.fleet([*params, *([("continue", token)] if token else [])])
        found += [n["name"] for n in page["nodes"]]
        token = page["continue"]
        if token is None:
            break
    assert sorted(found) == ["gpu-node-17", "gpu-node-4"]


async def test_a_shard_whose_owner_is_down_is_named_and_the_walk_goes_on() -> None:
    replicas, peers = cluster([{0}, {1}, {2}], NAMES, STATES)
    assert isinstance(peers, InProcessPeers) and replicas[0].reads is not None
    peers.down.add(1)
    names, pages = await walk_all(replicas[0].reads, 4)
    assert names == [n for n in shard_order() if n not in NAMES[1]]
    named = [u for p in pages for u in p["shards"]["unavailable"]]
    assert named == [{"shard": 1, "reason": "did not answer"}]
    overview = await replicas[0].reads.overview([])
    assert overview["shards"]["unavailable"] == [{"shard": 1, "reason": "did not answer"}]
    assert overview["summary"]["nodes"] == 30 - len(NAMES[1])


async def test_a_shard_nobody_owns_is_unavailable() -> None:
    replicas, _ = cluster([{0}, {2}], NAMES, STATES)
    assert replicas[0].reads is not None
    page = await replicas[0].reads.fleet([])
    assert [u["shard"] for u in page["shards"]["unavailable"]] == [1]


async def test_http_scope_local_bad_queries_and_forged_tokens() -> None:
    replicas, _ = cluster([{0, 2}, {1}], NAMES, STATES)
    async with TestClient(TestServer(replicas[0].app())) as client:
        local = await (await client.get(FLEET_PATH, params={"scope": "local"})).json()
        assert local["shards"] == [0, 2]
        assert sorted(n["name"] for n in local["nodes"]) == sorted(NAMES[0] + NAMES[2])
        local_overview = await (await client.get(OVERVIEW_PATH, params={"scope": "local"})).json()
        assert local_overview["summary"]["nodes"] == len(NAMES[0] + NAMES[2])
        merged = await (await client.get(OVERVIEW_PATH)).json()
        assert merged["summary"]["nodes"] == 30
        for params, error in [
            ({"continue": "garbage"}, "continue: not a token this API issued"),
            ({"continue": encode_continue("gpu-node-3")}, "continue: not a token"),
            ({"continue": encode_walk(Walk(3))}, "there are 3 shards"),
            ({"limit": "0"}, "limit: must be"),
            ({"state": "bogus"}, "state: unknown"),
        ]:
            resp = await client.get(FLEET_PATH, params=params)
            assert resp.status == 400, params
            assert error in (await resp.json())["error"]
        resp = await client.get(OVERVIEW_PATH, params={"state": "bogus"})
        assert resp.status == 400
        assert (await client.get("/api/v1/breaker")).status == 200  # other routes untouched


async def test_the_status_command_shows_the_whole_fleet_through_any_replica() -> None:
    replicas, peers = cluster([{0, 2}, {1}], NAMES, STATES)
    assert isinstance(peers, InProcessPeers)
    async with TestServer(replicas[0].app()) as server:
        url = str(server.make_url("/"))
        fleet = await asyncio.to_thread(fetch_fleet, url, page_limit=4)
        assert [n["name"] for n in fleet["nodes"]] == shard_order()
        assert exit_code(fleet) == EXIT_UNHEALTHY and "INCOMPLETE" not in render_table(fleet)
        peers.down.add(1)
        fleet = await asyncio.to_thread(fetch_fleet, url, page_limit=4)
    assert {n["name"] for n in fleet["nodes"]} == set(NAMES[0] + NAMES[2])
    assert "shard 1 not read: did not answer" in render_table(fleet)
    assert exit_code({**fleet, "nodes": []}) == EXIT_INCOMPLETE
