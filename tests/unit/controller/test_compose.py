"""The composed controller without an API server: its HTTP surface (/api/v1/fleet, /readyz,
the breaker reset, /metrics) and the split between replica tasks and leader work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.app import Controller
from gpuhealth.controller.breaker.gate import HardWrite
from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.leadership.work import LeaderWork, NamedTask
from gpuhealth.controller.names import Keys
from gpuhealth.controller.settings import load_config
from gpuhealth.controller.taints.policy import Taint
from gpuhealth.protocol import Condition
from tests.support.fleet import connect
from tests.support.wait import until

XID = Condition(reason="XidError", code="xid-79", severity="unhealthy")


def controller(**over: object) -> Controller:
    cfg = load_config(None, {"kubeconfig": "unused", **over})
    return build_controller(cfg, None)  # type: ignore[arg-type]


def feed(ctl: Controller, node: str, bad: bool) -> None:
    """An agent reports one GPU on ``node``, unhealthy (XID 79) when ``bad``."""
    connect(ctl.parts.fleet, node, 1, faults={0: XID} if bad else None)


async def test_fleet_json_readyz_and_metrics() -> None:
    ctl = controller(http={"auth": {"reads": "open"}})  # no API server to review a token
    feed(ctl, "n1", bad=True)
    ctl.parts.cache.update(
        NodeView(
            name="n1",
            resource_version="1",
            gpus=1,
            taints=({"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"},),
        )
    )
    ctl.parts.cache.update(NodeView(name="n2", resource_version="1", gpus=8))
    async with TestClient(TestServer(ctl.web_app())) as client:
        resp = await client.get("/api/v1/fleet")
        body = await resp.json()
        assert resp.status == 200
        assert [n["name"] for n in body["nodes"]] == ["n1", "n2"]
        n1 = body["nodes"][0]
        assert n1["state"] == "unhealthy" and n1["connected"] and n1["agent"]
        assert n1["gpus"][0]["conditions"][0]["code"] == "xid-79"
        assert n1["taints"][0]["key"] == "gpuhealth.io/unhealthy"
        assert body["nodes"][1]["agent"] is False
        assert body["summary"]["nodes"]["unhealthy"] == 1
        assert (await client.get("/readyz")).status == 503
        refused = await client.post("/api/v1/breaker/reset")  # no token: never reaches it
        assert refused.status == 401
        assert (await refused.json())["error"] == "unauthenticated"
        text = await (await client.get("/metrics")).text()
        assert 'gpuhealth_nodes{state="unhealthy"} 1.0' in text
        assert (
            'gpuhealth_node_tainted{effect="NoSchedule",key="gpuhealth.io/unhealthy",'
            'node="n1",reason="xid-79"} 1.0' in text
        )
        assert "gpuhealth_controller_is_leader 0.0" in text
        assert "gpuhealth_controller_connected_agents 1.0" in text


def names(tasks: Iterable[NamedTask]) -> list[str]:
    return [t.name for t in tasks]


async def test_every_replica_watches_and_campaigns_only_the_leader_writes() -> None:
    ctl = controller()
    assert names(ctl.replica_tasks) == [
        "node-watch",
        "fleet-silence",
        "remediation-episodes",
        "incident-judge",
        "unwatched-nodes",
        "incident-objects",
        "capability-incidents",
        "agent-pods",
        "stream-review-expiry",
        "idle-tracker",
        "nvlink-domains",
        "leader-election",
        "loop-lag",
        "gc-hold",
    ]
    assert names(ctl.parts.leader_work.tasks) == [
        "reconciler",
        "incident-mirror",
        "breaker-state",
        "dra-device-taints",
    ]
    dry = controller(dry_run=True, idle={"enabled": False}, dra={"enabled": False})
    assert names(dry.replica_tasks) == [
        "node-watch",
        "fleet-silence",
        "remediation-episodes",
        "incident-judge",
        "unwatched-nodes",
        "incident-objects",
        "capability-incidents",
        "agent-pods",
        "stream-review-expiry",
        "nvlink-domains",
        "leader-election",
        "loop-lag",
        "gc-hold",
    ]
    # decides and logs only (the mirror asks may_write before each write: none in dry run)
    assert names(dry.parts.leader_work.tasks) == ["reconciler", "incident-mirror"]
    assert dry.parts.idle is None and dry.parts.dra is None
    uncached = controller(stream={"auth_cache_ttl_s": 0})  # nothing cached, nothing to expire
    assert "stream-review-expiry" not in names(uncached.replica_tasks)
    pinging = controller(stream={"ws_ping_interval_s": 30})  # pings only when asked for
    assert names(pinging.replica_tasks)[7:10] == [
        "agent-pods",
        "stream-review-expiry",
        "stream-pings",
    ]


async def test_remediation_watches_on_every_replica_and_runs_as_leader_work() -> None:
    """Off by default: no runner, but the episodes are watched and their quarantine read (a
    loop turned off releases no node); on: the runner only while leading. Until the episode
    store has synced, a node keeps the quarantine taint it has."""
    off = controller()
    assert "remediation-episodes" in names(off.replica_tasks)
    assert "remediation" not in names(off.parts.leader_work.tasks)
    ctl = controller(remediation={"enabled": True}, idle={"enabled": False})
    assert "remediation-episodes" in names(ctl.replica_tasks)
    assert "remediation" not in names(ctl.replica_tasks)
    assert names(ctl.parts.leader_work.tasks)[-1] == "remediation"
    keys = Keys()
    held = Taint(keys.quarantine_taint, "escalated", "NoSchedule")
    for parts in (off.parts, ctl.parts):
        quarantine = parts.reconciler.quarantine
        assert quarantine is not None
        assert quarantine(NodeView(name="n1", resource_version="1")) is None
        tainted = NodeView(name="n1", resource_version="1", taints=(held.to_api(),))
        assert quarantine(tainted) == held  # not synced: kept as it is


async def test_leader_work_prepares_then_runs_its_tasks_together() -> None:
    order: list[str] = []
    stop = asyncio.Event()

    async def prepare() -> None:
        order.append("prepare")

    def task(name: str) -> NamedTask:
        async def run() -> None:
            order.append(name)
            await stop.wait()

        return NamedTask(name, run)

    work = LeaderWork(prepare=prepare, tasks=(task("a"), task("b")))
    running = asyncio.create_task(work.run())
    await until(lambda: len(order) == 3, "both tasks started")
    assert order == ["prepare", "a", "b"]
    stop.set()
    await asyncio.wait_for(running, 5)


async def test_a_leader_that_has_not_loaded_its_state_is_not_ready_and_writes_nothing_hard() -> (
    None
):
    """Holding the Lease is not enough: until its leader work has prepared (the breaker's
    stored state loaded), /readyz is 503 and the one gate refuses every hard write."""
    ctl = controller()
    ctl.parts.cache.informer.synced.set()
    ctl.parts.elector.is_leader = True  # the Lease won; prepare still loading the breaker
    write = HardWrite("n1", "node-taint")
    async with TestClient(TestServer(ctl.web_app())) as client:
        resp = await client.get("/readyz")
        assert resp.status == 503
        assert await resp.json() == {"leader": True, "leader_ready": False, "synced": True}
        refused = ctl.parts.gate.request(write)
        assert (refused.allowed, refused.reason) == (False, "NotLeader")
        assert not ctl.parts.gate.request_group(["n1", "n2"], "node-taint").allowed
        ctl.parts.leader_work.ready = True  # prepare done
        assert (await client.get("/readyz")).status == 200
        assert ctl.parts.gate.request(write).allowed
