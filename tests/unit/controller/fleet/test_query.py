"""The fleet API's query (pure): filters, label selectors, pages and continue tokens."""

from __future__ import annotations

import pytest

from gpuhealth.controller.fleet.query import (
    MAX_LIMIT,
    FleetFilter,
    FleetNodeSummary,
    FleetQuery,
    LabelRequirement,
    QueryError,
    decode_continue,
    encode_continue,
    parse_query,
    parse_selector,
)


def summary(
    state: str = "healthy",
    pool: str = "",
    reasons: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
) -> FleetNodeSummary:
    return FleetNodeSummary(
        name="n",
        state=state,
        pool=pool,
        reason=reasons[0] if reasons else "",
        reasons=frozenset(reasons),
        labels=labels or {},
        tainted=False,
        connected=True,
        gpus=(8, 0, 0, 0),
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("a=b", (LabelRequirement("a", "=", "b"),)),
        ("a==b", (LabelRequirement("a", "=", "b"),)),
        ("a!=b", (LabelRequirement("a", "!=", "b"),)),
        ("a", (LabelRequirement("a", "exists"),)),
        ("!a", (LabelRequirement("a", "!exists"),)),
        (
            " pool = x , gpu ",
            (LabelRequirement("pool", "=", "x"), LabelRequirement("gpu", "exists")),
        ),
        ("", ()),
    ],
)
def test_selector(text: str, want: tuple[LabelRequirement, ...]) -> None:
    assert parse_selector(text) == want


@pytest.mark.parametrize("text", ["a in (x,y)", "=b", "!=b"])
def test_selector_refused(text: str) -> None:
    with pytest.raises(QueryError):
        parse_selector(text)


@pytest.mark.parametrize(
    ("flt", "node", "matches"),
    [
        (FleetFilter(), summary(), True),
        (FleetFilter(states=frozenset({"unhealthy"})), summary("unhealthy"), True),
        (FleetFilter(states=frozenset({"unhealthy"})), summary("degraded"), False),
        (FleetFilter(pools=frozenset({"a"})), summary(pool="a"), True),
        (FleetFilter(pools=frozenset({"a"})), summary(pool="b"), False),
        (FleetFilter(pools=frozenset({""})), summary(pool=""), True),
        (FleetFilter(reasons=frozenset({"xid-79"})), summary(reasons=("hot", "xid-79")), True),
        (FleetFilter(reasons=frozenset({"xid-79"})), summary(reasons=("hot",)), False),
        (FleetFilter(labels=parse_selector("a=b")), summary(labels={"a": "b"}), True),
        (FleetFilter(labels=parse_selector("a!=b")), summary(labels={"a": "b"}), False),
        (FleetFilter(labels=parse_selector("a!=b")), summary(), True),
        (FleetFilter(labels=parse_selector("!a")), summary(labels={"a": ""}), False),
        (
            FleetFilter(states=frozenset({"unhealthy"}), labels=parse_selector("a")),
            summary("unhealthy"),
            False,
        ),
    ],
)
def test_filter(flt: FleetFilter, node: FleetNodeSummary, matches: bool) -> None:
    assert flt.matches(node) is matches


@pytest.mark.parametrize(
    ("params", "want"),
    [
        ([], FleetQuery()),
        (
            [("state", "unhealthy,degraded"), ("state", "unknown")],
            FleetQuery(FleetFilter(states=frozenset({"unhealthy", "degraded", "unknown"}))),
        ),
        ([("pool", "a,b")], FleetQuery(FleetFilter(pools=frozenset({"a", "b"})))),
        ([("reason", "xid-79")], FleetQuery(FleetFilter(reasons=frozenset({"xid-79"})))),
        (
            [("label", "a=b"), ("label", "c")],
            FleetQuery(FleetFilter(labels=parse_selector("a=b,c"))),
        ),
        ([("limit", "10")], FleetQuery(limit=10)),
        ([("continue", encode_continue("gpu-node-9"))], FleetQuery(after="gpu-node-9")),
        ([("other", "x")], FleetQuery()),
    ],
)
def test_parse_query(params: list[tuple[str, str]], want: FleetQuery) -> None:
    assert parse_query(params) == want


@pytest.mark.parametrize(
    "params",
    [
        [("state", "broken")],
        [("limit", "0")],
        [("limit", str(MAX_LIMIT + 1))],
        [("limit", "ten")],
        [("continue", "not-a-token")],
        [("continue", encode_continue("x")[:-2] + "!!")],
        [("label", "a in (b)")],
    ],
)
def test_parse_query_refuses(params: list[tuple[str, str]]) -> None:
    with pytest.raises(QueryError):
        parse_query(params)


def test_continue_round_trip_and_everything() -> None:
    for name in ("gpu-node-1", "a/b=c", "ü"):
        assert decode_continue(encode_continue(name)) == name
    assert FleetQuery().everything
    assert not FleetQuery(limit=1).everything
    assert not FleetQuery(FleetFilter(pools=frozenset())).everything
