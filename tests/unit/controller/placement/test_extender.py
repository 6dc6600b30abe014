"""Scheduler extender: pod requests, filter and prioritize over node summaries, Go-named JSON."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.placement.extender import (
    ExtenderArgs,
    ExtenderError,
    FilterOutcome,
    Pod,
    filter_nodes,
    filter_result,
    node_names,
    parse_count,
    pod_request,
    prioritize,
    prioritize_json,
)
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.placement.view import summarize
from tests.support.placement import alloc, gpu

GPU = "nvidia.com/gpu"
S = ExtenderSettings()


def container(req: int | None = None, lim: int | None = None, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if req is not None:
        res["requests"] = {GPU: str(req), "cpu": "100m"}
    if lim is not None:
        res["limits"] = {GPU: str(lim)}
    return {"name": "c", "resources": res, **extra}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> Pod:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return msgspec.convert({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}, Pod)


@pytest.mark.parametrize(
    ("name", "p", "want"),
    [
        ("no gpu", pod([container()]), 0),
        ("limit only", pod([container(lim=2)]), 2),
        ("request wins over limit", pod([container(req=1, lim=1)]), 1),
        ("sum of containers", pod([container(lim=2), container(lim=3)]), 5),
        ("init larger than app", pod([container(lim=1)], [container(lim=4)]), 4),
        ("init smaller than app", pod([container(lim=3)], [container(lim=2)]), 3),
        (
            "sidecar adds to app",
            pod([container(lim=2)], [container(lim=1, restartPolicy="Always")]),
            3,
        ),
        (
            "init after sidecar includes sidecar",
            pod(
                [container(lim=1)],
                [container(lim=1, restartPolicy="Always"), container(lim=4)],
            ),
            5,
        ),
    ],
)
def test_pod_request(name: str, p: Pod, want: int) -> None:
    assert pod_request(p, GPU) == want, name


@pytest.mark.parametrize(
    ("value", "want"), [("1", 1), ("8", 8), (" 2 ", 2), ("1k", 1000), ("1Ki", 1024), (3, 3)]
)
def test_parse_count(value: str | int, want: int) -> None:
    assert parse_count(value) == want


@pytest.mark.parametrize("value", ["", "1.5", "-1", "500m", "abc", 1.5])
def test_parse_count_rejects(value: str | float) -> None:
    with pytest.raises(ExtenderError):
        parse_count(value)


@given(st.text(max_size=12))
def test_parse_count_never_crashes(value: str) -> None:
    with contextlib.suppress(ExtenderError):
        assert parse_count(value) >= 0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["Pod", "Nodes", "NodeNames", "x"]), _json))
def test_args_decoding_fails_only_with_known_errors(body: dict[str, Any]) -> None:
    raw = msgspec.json.encode(body)
    try:
        args = msgspec.json.decode(raw, type=ExtenderArgs)
    except msgspec.ValidationError:
        return
    with contextlib.suppress(ExtenderError):
        names = node_names(args)
        need = 0 if args.pod is None else pod_request(args.pod, GPU)
        filter_nodes(names, need, {})


def summaries() -> dict[str, Any]:
    return {
        "bad": summarize("bad", [gpu(0), gpu(1, "unhealthy")], [], S),
        "full": summarize("full", [gpu(0), gpu(1)], [alloc(0), alloc(1)], S),
        "ok": summarize("ok", [gpu(0), gpu(1)], [], S),
    }


def test_filter_table() -> None:
    out = filter_nodes(["bad", "full", "ok", "noagent"], 2, summaries())
    assert out.passed == ["ok", "noagent"]
    assert set(out.unresolvable) == {"bad"}
    assert "1 free healthy GPU(s), pod needs 2" in out.unresolvable["bad"]
    assert out.unresolvable["bad"].endswith("(1 of 2 unhealthy: xid-79)")
    # no per-node identifiers: the scheduler groups nodes by identical message
    assert (
        out.failed["full"] == "gpuhealth: 0 free healthy GPU(s), pod needs 2 (2 of 2 held by pods)"
    )
    assert (
        filter_nodes(["full"], 9, summaries())
        .unresolvable["full"]
        .startswith("gpuhealth: 0 free healthy GPU(s), pod needs 9")
    )
    assert set(out.failed) == {"full"}


def test_filter_zero_request_passes_everything() -> None:
    out = filter_nodes(["bad", "full"], 0, summaries())
    assert out.passed == ["bad", "full"]


def test_prioritize_prefers_cool_clean_and_neutral_unknown() -> None:
    sm = {
        "cool": summarize("cool", [gpu(0, temp=45, sbe=0)], [], S),
        "hot": summarize("hot", [gpu(0, temp=86, sbe=30)], [], S),
        "degraded": summarize("degraded", [gpu(0, "degraded", temp=40, sbe=0)], [], S),
    }
    scores = {h.host: h.score for h in prioritize(["cool", "hot", "degraded", "x"], sm, 5)}
    assert scores["cool"] == 10
    assert scores["cool"] > scores["hot"] > scores["degraded"]
    assert scores["x"] == 5
    assert all(0 <= v <= 10 for v in scores.values())


def test_precomputed_priority_json_matches_prioritize() -> None:
    sm = summaries()
    names = ["bad", "full", "ok", "no-agent"]
    fast = msgspec.json.decode(prioritize_json(names, sm, 5))
    assert fast == msgspec.json.decode(msgspec.json.encode(prioritize(names, sm, 5)))


def test_wire_names_are_go_names() -> None:
    body = {
        "Pod": {"metadata": {"name": "p"}, "spec": {"containers": [container(lim=1)]}},
        "NodeNames": ["a", "b"],
    }
    args = msgspec.json.decode(msgspec.json.encode(body), type=ExtenderArgs)
    assert args.node_names == ["a", "b"]
    out = FilterOutcome(passed=["a"], failed={"b": "no"}, unresolvable={})
    res = msgspec.json.decode(msgspec.json.encode(filter_result(args, ["a", "b"], out)))
    assert res == {"NodeNames": ["a"], "FailedNodes": {"b": "no"}}
    prio = msgspec.json.decode(msgspec.json.encode(prioritize(["a"], {}, 5)))
    assert prio == [{"Host": "a", "Score": 5}]


def test_full_node_objects_are_returned_unchanged() -> None:
    items = [{"metadata": {"name": n, "labels": {"x": n}}, "status": {}} for n in ("a", "b")]
    body = {"Pod": {"spec": {}}, "Nodes": {"items": items}}
    args = msgspec.json.decode(msgspec.json.encode(body), type=ExtenderArgs)
    names = node_names(args)
    assert names == ["a", "b"]
    out = FilterOutcome(passed=["b"], failed={}, unresolvable={"a": "no"})
    res = msgspec.json.decode(msgspec.json.encode(filter_result(args, names, out)))
    assert res["Nodes"] == {"items": [items[1]]}
    assert res["FailedAndUnresolvableNodes"] == {"a": "no"}
    assert "NodeNames" not in res


_state = st.sampled_from(["healthy", "degraded", "unhealthy", "unknown"])


@given(
    st.lists(
        st.tuples(
            st.lists(
                st.tuples(_state, st.floats(20, 100), st.integers(0, 500), st.booleans()),
                max_size=8,
            ),
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 9),
)
def test_filter_and_scores_are_consistent(nodes: list[Any], need: int) -> None:
    sm = {}
    for n, (gs,) in enumerate(nodes):
        gpus = [gpu(i, state, temp=t, sbe=e) for i, (state, t, e, _) in enumerate(gs)]
        allocs = [alloc(i) for i, (_, _, _, held) in enumerate(gs) if held]
        sm[f"n{n}"] = summarize(f"n{n}", gpus, allocs, S)
    names = [*sm, "unknown-node"]
    out = filter_nodes(names, need, sm)
    assert sorted([*out.passed, *out.failed, *out.unresolvable]) == sorted(names)
    for name in out.passed:
        assert name not in sm or sm[name].free >= need
    for name in out.unresolvable:
        assert sm[name].usable < need
    for h in prioritize(names, sm, 5):
        assert 0 <= h.score <= 10
        if h.host in sm and sm[h.host].usable and not sm[h.host].degraded:
            assert h.score >= 6
