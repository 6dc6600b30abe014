"""The shards' answers merged (pure): which answers count (coverage), the overview's sums and
its nodes cut at the limit, and the fleet walk's ``continue`` token (fuzzed: a token this API
did not issue is refused with a clear error, never taken)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.fleet.query import QueryError, encode_continue
from gpuhealth.controller.shards.merge import (
    FleetPage,
    Walk,
    coverage,
    decode_walk,
    encode_walk,
    merge_overviews,
    pick_nodes,
    sum_groups,
)
from gpuhealth.controller.shards.peers import ShardAnswer


def doc(*shards: int, **extra: Any) -> dict[str, Any]:
    return {"shards": list(shards), **extra}


def ok(asked: tuple[int, ...], *held: int, **extra: Any) -> ShardAnswer:
    return ShardAnswer(asked, doc(*held, **extra))


def down(asked: tuple[int, ...], why: str = "refused") -> ShardAnswer:
    return ShardAnswer(asked, None, why)


@pytest.mark.parametrize(
    ("answers", "count", "taken", "unavailable"),
    [
        pytest.param([ok((0, 1), 0, 1), ok((2,), 2)], 3, [[0, 1], [2]], {}, id="all-covered"),
        pytest.param(
            [ok((0,), 0), down((1, 2), "timed out")],
            3,
            [[0]],
            {1: "timed out", 2: "timed out"},
            id="an-owner-down-names-its-shards",
        ),
        pytest.param(
            [ok((0,), 0), ok((1, 2), 1)],
            3,
            [[0], [1]],
            {2: "its owner no longer holds it; read again"},
            id="owner-lost-one-of-its-shards",
        ),
        pytest.param(
            [ok((0, 1), 0, 1), ok((2,), 1, 2)],
            3,
            [[0, 1]],
            {2: "changing hands: held by two answers; read again"},
            id="overlap-left-out-whole",
        ),
        pytest.param(
            [ok((0,), 0, 1), ok((1,), 1)],
            2,
            [[0, 1]],
            {},
            id="an-owner-took-a-shard-since-its-address-was-read",
        ),
        pytest.param([ok((0,), 0)], 2, [[0]], {1: "not read"}, id="a-shard-never-asked"),
        pytest.param(
            [ok((0,), 0, 7, -1, "1")],
            2,
            [[0, 7, -1, "1"]],
            {1: "not read"},
            id="bad-shards-ignored",
        ),
    ],
)
def test_coverage(
    answers: list[ShardAnswer],
    count: int,
    taken: list[list[Any]],
    unavailable: dict[int, str],
) -> None:
    cover = coverage(answers, count)
    assert [d["shards"] for d in cover.taken] == taken
    assert dict(cover.unavailable) == unavailable


def overview(shards: list[int], **parts: Any) -> dict[str, Any]:
    return {
        "shards": shards,
        "generated_at": f"from {shards}",
        "summary": {
            "nodes": parts.get("nodes", 0),
            "gpus": parts.get("gpus", 0),
            "nodes_by_state": parts.get("by_state", {}),
            "gpus_by_state": {},
            "tainted_nodes": parts.get("tainted", 0),
            "idle_allocations": 0,
            "connected_agents": parts.get("nodes", 0),
        },
        "groups": parts.get("groups", []),
        "nodes_matched": len(parts.get("listed", [])),
        "nodes": parts.get("listed", []),
        "breaker": {"open": parts.get("open", False)},
        "idle": parts.get("idle"),
        "incidents": parts.get("incidents", []),
        "events": parts.get("events", []),
    }


def group(state: str, n: int, pool: str = "", reason: str = "") -> dict[str, Any]:
    return {"state": state, "pool": pool, "reason": reason, "nodes": n}


def listed(name: str, state: str = "healthy") -> dict[str, Any]:
    return {"name": name, "state": state}


def test_the_overview_sums_the_shards_and_keeps_the_cluster_wide_parts_once() -> None:
    a = overview(
        [0, 2],
        nodes=3,
        gpus=6,
        by_state={"healthy": 2, "unhealthy": 1},
        tainted=1,
        groups=[group("unhealthy", 1, "a100", "xid-79"), group("healthy", 2, "a100")],
        listed=[listed("n-10", "unhealthy"), listed("n-2"), listed("n-3")],
        idle=[{"pod": "p"}],
        incidents=[{"id": "i1"}],
    )
    b = overview(
        [1],
        nodes=2,
        gpus=4,
        by_state={"healthy": 1, "degraded": 1},
        groups=[group("healthy", 1, "a100"), group("degraded", 1, "h100", "hot")],
        listed=[listed("n-1"), listed("n-9", "degraded")],
        idle=[],
        open=True,
        incidents=[{"id": "i1"}],
    )
    merged = merge_overviews([ok((0, 2), 0, 2, **a), ok((1,), 1, **b)], 3, limit=10)
    summary = merged["summary"]
    assert (summary["nodes"], summary["gpus"], summary["tainted_nodes"]) == (5, 10, 1)
    assert summary["nodes_by_state"] == {"healthy": 3, "unhealthy": 1, "degraded": 1}
    assert merged["groups"] == [
        group("unhealthy", 1, "a100", "xid-79"),
        group("degraded", 1, "h100", "hot"),
        group("healthy", 3, "a100"),
    ]
    assert [n["name"] for n in merged["nodes"]] == ["n-1", "n-2", "n-3", "n-9", "n-10"]
    assert merged["nodes_matched"] == 5
    assert merged["idle"] == [{"pod": "p"}]
    assert merged["incidents"] == [{"id": "i1"}]  # every replica watches the same objects
    assert merged["generated_at"] == "from [0, 2]"
    assert [b["breaker"]["open"] for b in merged["breakers"]] == [False, True]
    assert merged["shards"] == {"count": 3, "read": [0, 1, 2], "unavailable": []}


def test_an_unavailable_shard_is_named_and_not_counted() -> None:
    a = overview([0], nodes=3, by_state={"healthy": 3}, groups=[group("healthy", 3)])
    merged = merge_overviews([ok((0,), 0, **a), down((1,), "no owner published")], 2, limit=10)
    assert merged["summary"]["nodes"] == 3
    assert merged["shards"] == {
        "count": 2,
        "read": [0],
        "unavailable": [{"shard": 1, "reason": "no owner published"}],
    }


def test_the_replicas_activity_is_merged_newest_first() -> None:
    a = overview([0], events=[{"at": "2026-12-02T10:05:00+00:00"}, {"at": "2026-12-02T10:01"}])
    b = overview([1], events=[{"at": "2026-12-02T10:03:00+00:00"}, "junk"])
    merged = merge_overviews([ok((0,), 0, **a), ok((1,), 1, **b)], 2, limit=10)
    assert [e["at"][11:16] for e in merged["events"]] == ["10:05", "10:03"]


def test_no_shard_answered_is_an_empty_overview_naming_every_shard() -> None:
    merged = merge_overviews([down((0, 1))], 2, limit=10)
    assert merged["summary"]["nodes"] == 0 and merged["nodes"] == [] and merged["idle"] is None
    assert [u["shard"] for u in merged["shards"]["unavailable"]] == [0, 1]


@pytest.mark.parametrize(
    ("nodes", "limit", "shown"),
    [
        (["b", "a"], 5, ["a", "b"]),
        (["n-10", "n-9", "n-1"], 3, ["n-1", "n-9", "n-10"]),
        (["h1", "u2", "h3", "u4"], 2, ["u2", "u4"]),
        (["h1", "u2", "h3", "h4"], 3, ["h1", "h3", "u2"]),
        (["u1", "u2", "u3"], 2, ["u1", "u2"]),
    ],
)
def test_pick_nodes_lists_problem_nodes_first_in_name_order(
    nodes: list[str], limit: int, shown: list[str]
) -> None:
    docs = [listed(n, "unhealthy" if n.startswith("u") else "healthy") for n in nodes]
    assert [n["name"] for n in pick_nodes(docs, limit)] == shown


def test_sum_groups_orders_worst_first_and_drops_empty_and_malformed() -> None:
    docs = [
        {
            "groups": [
                group("healthy", 2, "b"),
                group("unknown", 0),
                "junk",
                group("healthy", 1, "a"),
            ]
        },
        {"groups": [group("healthy", 1, "b"), {"state": "degraded", "nodes": "x"}]},
        {"groups": None},
    ]
    assert sum_groups(docs) == [group("healthy", 1, "a"), group("healthy", 3, "b")]


# -- the fleet walk -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "walk",
    [Walk(0), Walk(2), Walk(1, encode_continue("gpu-node-17")), Walk(0, encode_continue("a:b"))],
)
def test_walk_tokens_round_trip(walk: Walk) -> None:
    assert decode_walk(encode_walk(walk), 3) == walk


@pytest.mark.parametrize(
    ("token", "error"),
    [
        ("", "not a token this API issued"),
        ("!!!", "not a token this API issued"),
        (encode_continue("gpu-node-1"), "not a token this API issued"),  # one replica's token
        (encode_walk(Walk(3)), "a token for shard 3; there are 3 shards"),
        (encode_walk(Walk(0, "garbage*")), "not a token this API issued"),
        ("czE6LTE6", "not a token this API issued"),  # s1:-1:
        ("czE6MDE6", "a token for shard 01"),  # s1:01: (not how a shard is written)
    ],
)
def test_forged_walk_tokens_are_refused_clearly(token: str, error: str) -> None:
    with pytest.raises(QueryError, match=error):
        decode_walk(token, 3)


@given(st.text(max_size=80))
def test_any_text_is_a_walk_or_a_clear_refusal(token: str) -> None:
    try:
        walk = decode_walk(token, 4)
    except QueryError as exc:
        assert str(exc).startswith("continue: ")
    else:
        assert 0 <= walk.shard < 4


@given(st.binary(max_size=60), st.integers(1, 8))
def test_any_bytes_behind_base64_are_a_walk_or_a_clear_refusal(raw: bytes, count: int) -> None:
    import base64

    token = base64.urlsafe_b64encode(b"s1:" + raw).decode().rstrip("=")
    try:
        walk = decode_walk(token, count)
    except QueryError as exc:
        assert str(exc).startswith("continue: ")
    else:
        assert 0 <= walk.shard < count and decode_walk(encode_walk(walk), count) == walk


@given(st.integers(0, 63), st.text(min_size=1, max_size=40))
def test_every_issued_token_is_taken_back(shard: int, after: str) -> None:
    walk = Walk(shard, encode_continue(after))
    assert decode_walk(encode_walk(walk), 64) == walk


def test_a_fleet_page_takes_a_shards_nodes_only_from_its_owner_while_it_holds_it() -> None:
    page = FleetPage(3)
    assert page.add(ok((0,), 0, 2, nodes=["a"], summary={"nodes": {"healthy": 2}}))
    assert not page.add(ok((1,), 2, nodes=["moved"], summary={"nodes": {"healthy": 9}}))
    assert page.add(ok((2,), 0, 2, nodes=["c"], summary={"nodes": {"healthy": 2}}))
    doc = page.document(Walk(2, encode_continue("c")))
    assert doc["nodes"] == ["a", "c"]
    assert doc["summary"]["nodes"] == {"healthy": 2}  # one replica, counted once
    assert doc["shards"]["read"] == [0, 2]
    assert doc["shards"]["unavailable"] == [
        {"shard": 1, "reason": "its owner no longer holds it; read again"}
    ]
    assert decode_walk(doc["continue"], 3) == Walk(2, encode_continue("c"))
    assert FleetPage(1).document(None)["continue"] is None
