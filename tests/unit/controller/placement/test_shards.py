"""The extender past one process: a node this replica does not hold is judged from the taints
of the Node object the scheduler sent (tolerations honoured), scored from the other owners'
summaries while they are fresh (neutral after), and the filter never fails for a peer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.names import Keys
from gpuhealth.controller.placement import ExtenderHandlers, ExtenderSettings, extender_app
from gpuhealth.controller.placement.extender import (
    ExtenderArgs,
    FilterOutcome,
    NodeTaint,
    Toleration,
    blocking_taint,
    judge_unheld,
    prioritize_json,
    tolerates,
)
from gpuhealth.controller.placement.http import ShardedPlacement
from gpuhealth.controller.placement.peer_scores import SCORES_PATH, PeerScores, read_scores
from gpuhealth.controller.placement.view import summarize
from gpuhealth.controller.shards.peers import ShardAnswer
from tests.support.clock import FakeClock

K = Keys()
SETTINGS = ExtenderSettings(peer_summary_max_age_s=5.0, peer_summary_refresh_s=2.0)
UNHEALTHY = NodeTaint(f"{K.prefix}/unhealthy", "xid-79", "NoSchedule")
EVICTING = NodeTaint(f"{K.prefix}/unhealthy", "xid-48", "NoExecute")
DEGRADED = NodeTaint(f"{K.prefix}/degraded", "hot", "PreferNoSchedule")
FOREIGN = NodeTaint("example.com/maintenance", "", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration(operator="Exists"), UNHEALTHY, True),
        (Toleration(key=UNHEALTHY.key, operator="Exists"), UNHEALTHY, True),
        (Toleration(key=UNHEALTHY.key, operator="Exists", effect="NoExecute"), UNHEALTHY, False),
        (Toleration(key=UNHEALTHY.key, value="xid-79"), UNHEALTHY, True),
        (Toleration(key=UNHEALTHY.key, operator="Equal", value="xid-48"), UNHEALTHY, False),
        (Toleration(key="other", operator="Exists"), UNHEALTHY, False),
        (Toleration(value="xid-79"), UNHEALTHY, False),
    ],
)
def test_tolerates(toleration: Toleration, taint: NodeTaint, tolerated: bool) -> None:
    assert tolerates(toleration, taint) is tolerated


@pytest.mark.parametrize(
    ("taints", "tolerations", "blocking"),
    [
        ([], [], None),
        ([UNHEALTHY], [], UNHEALTHY),
        ([EVICTING], [], EVICTING),
        ([DEGRADED], [], None),  # only disfavours
        ([FOREIGN], [], None),  # not ours: the scheduler's own filter judges it
        ([FOREIGN, UNHEALTHY], [Toleration(key=UNHEALTHY.key, operator="Exists")], None),
        ([UNHEALTHY, EVICTING], [Toleration(key=UNHEALTHY.key, value="xid-79")], EVICTING),
    ],
)
def test_blocking_taint(
    taints: list[NodeTaint], tolerations: list[Toleration], blocking: NodeTaint | None
) -> None:
    assert blocking_taint(taints, K.owns, tolerations) == blocking


def node(name: str, *taints: NodeTaint) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": [msgspec.to_builtins(t) for t in taints]},
    }


def args(nodes: Sequence[dict[str, Any]] | None, *tolerations: dict[str, str]) -> ExtenderArgs:
    body = {
        "Pod": {
            "spec": {
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "tolerations": list(tolerations),
            }
        },
        "Nodes": {"items": list(nodes)} if nodes is not None else None,
        "NodeNames": None if nodes is not None else ["x", "y"],
    }
    return msgspec.json.decode(msgspec.json.encode(body), type=ExtenderArgs)


@pytest.mark.parametrize(
    ("nodes", "tolerations", "passed", "unresolvable"),
    [
        pytest.param(
            [
                node("held", UNHEALTHY),
                node("clean"),
                node("bad", UNHEALTHY),
                node("soft", DEGRADED),
            ],
            [],
            ["held", "clean", "soft"],
            {"bad": f"gpuhealth: node has taint {K.prefix}/unhealthy=xid-79:NoSchedule"},
            id="a-tainted-node-of-another-shard-fails",
        ),
        pytest.param(
            [node("bad", UNHEALTHY)],
            [{"key": UNHEALTHY.key, "operator": "Exists"}],
            ["bad"],
            {},
            id="tolerated",
        ),
        pytest.param(None, [], ["x", "y"], {}, id="names-only-pass"),
    ],
)
def test_judge_unheld(
    nodes: list[dict[str, Any]] | None,
    tolerations: list[dict[str, str]],
    passed: list[str],
    unresolvable: dict[str, str],
) -> None:
    a = args(nodes, *tolerations)
    names = [n["metadata"]["name"] for n in nodes] if nodes is not None else ["x", "y"]
    outcome = judge_unheld(a, FilterOutcome(names, {}, {}), {"held"}, K.owns)
    assert outcome.passed == passed
    assert outcome.unresolvable == unresolvable


def test_prioritize_scores_other_shards_nodes_from_their_owners() -> None:
    local = {"a": summarize("a", [], [], SETTINGS)}
    body = prioritize_json(["a", "b", "c"], local, 5, {"b": 9})
    scores = {e["Host"]: e["Score"] for e in msgspec.json.decode(body)}
    assert scores == {"a": local["a"].score, "b": 9, "c": 5}
    assert prioritize_json(["b"], local, 5) == b'[{"Host":"b","Score":5}]'  # one process


@dataclass
class Owners:
    """Owners answering ``/scheduler/scores`` from a table: address group -> answer."""

    count: int = 3
    answers: list[ShardAnswer] = field(default_factory=list)
    asked: list[tuple[int, ...]] = field(default_factory=list)

    async def ask_owners(
        self, shards: Sequence[int], path: str, params: Sequence[tuple[str, str]]
    ) -> list[ShardAnswer]:
        assert path == SCORES_PATH
        self.asked.append(tuple(shards))
        return list(self.answers)


def scores(shards: list[int], table: dict[str, Any]) -> dict[str, Any]:
    return {"shards": shards, "scores": table}


async def test_peer_scores_are_used_while_fresh_then_neutral() -> None:
    clock = FakeClock()
    owners = Owners(answers=[ShardAnswer((1, 2), scores([1, 2], {"b": 9, "c": 2}))])
    peers = PeerScores(owners, lambda: frozenset({0}), SETTINGS, clock=clock)
    assert peers.scores() == {}
    await peers.refresh()
    assert owners.asked == [(1, 2)]
    assert peers.scores() == {"b": 9, "c": 2}
    clock.advance(5.0)
    assert peers.scores() == {"b": 9, "c": 2}
    owners.answers = [ShardAnswer((1, 2), None, "refused")]
    await peers.refresh()  # a failed refresh keeps what is still fresh
    assert peers.scores() == {"b": 9, "c": 2}
    clock.advance(0.5)
    assert peers.scores() == {}  # past peer_summary_max_age_s: neutral
    owners.answers = [ShardAnswer((1,), scores([1], {"b": 7})), ShardAnswer((2,), None, "down")]
    await peers.refresh()
    assert peers.scores() == {"b": 7}


async def test_a_shard_taken_over_here_stops_using_its_peer_scores() -> None:
    clock = FakeClock()
    owned = {0}
    owners = Owners(answers=[ShardAnswer((1,), scores([1], {"b": 9}))])
    peers = PeerScores(owners, lambda: frozenset(owned), SETTINGS, clock=clock)
    await peers.refresh()
    assert peers.scores() == {"b": 9}
    owned.add(1)
    owners.answers = []
    await peers.refresh()
    assert peers.scores() == {}


@pytest.mark.parametrize(
    ("body", "read"),
    [
        ({"scores": {"a": 3, "b": 11, "c": -1, "d": "5", "e": True}}, {"a": 3}),
        ({"scores": []}, {}),
        ({}, {}),
    ],
)
def test_read_scores_drops_malformed_entries(body: dict[str, Any], read: dict[str, int]) -> None:
    assert read_scores(body) == read


async def test_the_handlers_past_one_process() -> None:
    clock = FakeClock()
    owners = Owners(answers=[ShardAnswer((1,), scores([1], {"remote": 8}))])
    peers = PeerScores(owners, lambda: frozenset({0}), SETTINGS, clock=clock)
    await peers.refresh()
    local = {"held": summarize("held", [], [], SETTINGS)}
    handlers = ExtenderHandlers(
        lambda: local,
        SETTINGS,
        shards=ShardedPlacement(owned=lambda: frozenset({0}), owns=K.owns, peers=peers),
    )
    async with TestClient(TestServer(extender_app(handlers))) as client:
        body = msgspec.json.encode(args([node("held"), node("remote"), node("bad", EVICTING)]))
        result = await (await client.post("/scheduler/filter", data=body)).json()
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["remote"]
        assert "held" in result["FailedAndUnresolvableNodes"]  # no GPUs here: as in one process
        assert result["FailedAndUnresolvableNodes"]["bad"].endswith("xid-48:NoExecute")
        prio = await (await client.post("/scheduler/prioritize", data=body)).json()
        assert {e["Host"]: e["Score"] for e in prio}["remote"] == 8
        assert {e["Host"]: e["Score"] for e in prio}["bad"] == SETTINGS.unknown_node_score
        own = await (await client.get(SCORES_PATH)).json()
        assert own == {"shards": [0], "scores": {"held": local["held"].score}}


async def test_one_process_has_no_scores_route() -> None:
    handlers = ExtenderHandlers(dict, SETTINGS)
    async with TestClient(TestServer(extender_app(handlers))) as client:
        assert (await client.get(SCORES_PATH)).status in (404, 405)
