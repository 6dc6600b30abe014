"""The controller's HTTP surface without an API server: /api/v1/fleet, /readyz, /metrics,
and the reconciler's breaker decision (a trip queues the Event and counts the metric)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.app import Controller
from gpuhealth.controller.config import load_config
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.protocol import Condition
from tests.support.fleet import connect
from tests.support.protocol import recovery

XID = Condition(reason="XidError", code="xid-79", severity="unhealthy")


def controller(**over: object) -> Controller:
    cfg = load_config(None, {"kubeconfig": "unused", **over})
    return Controller(cfg, None)  # type: ignore[arg-type]


def feed(ctl: Controller, node: str, bad: bool) -> None:
    """An agent reports one GPU on ``node``, unhealthy (XID 79) when ``bad``."""
    connect(ctl.fleet, node, 1, faults={0: XID} if bad else None)


async def test_fleet_json_readyz_and_metrics() -> None:
    ctl = controller()
    feed(ctl, "n1", bad=True)
    ctl.cache.update(
        NodeView(
            name="n1",
            resource_version="1",
            gpus=1,
            taints=({"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"},),
        )
    )
    ctl.cache.update(NodeView(name="n2", resource_version="1", gpus=8))
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
        assert (await client.post("/api/v1/breaker/reset")).status == 409
        text = await (await client.get("/metrics")).text()
        assert 'gpuhealth_nodes{state="unhealthy"} 1.0' in text
        assert (
            'gpuhealth_node_tainted{effect="NoSchedule",key="gpuhealth.io/unhealthy",'
            'node="n1",reason="xid-79"} 1.0' in text
        )
        assert "gpuhealth_controller_is_leader 0.0" in text
        assert "gpuhealth_controller_connected_agents 1.0" in text


async def test_breaker_trip_blocks_the_plan_and_queues_the_event() -> None:
    ctl = controller(breaker={"max_fraction": 0.0, "min_nodes": 1})
    for n in ("a", "b"):
        feed(ctl, n, bad=True)
        ctl.cache.update(NodeView(name=n, resource_version="1", gpus=1))
    plan_a, _ = ctl.reconciler.plan(ctl.cache.get("a"))  # type: ignore[arg-type]
    assert plan_a.added and not plan_a.blocked
    plan_b, _ = ctl.reconciler.plan(ctl.cache.get("b"))  # type: ignore[arg-type]
    assert plan_b.blocked and not plan_b.added
    assert ctl.breaker.is_open
    assert ctl.metrics.breaker_trips._value.get() == 1
    node, event = ctl.reconciler._kube_events.get_nowait()
    assert (node, event.reason) == ("b", "CircuitBreakerOpen")
    # a recovering node is never blocked
    ctl.fleet.on_message("a", recovery("a", 0))
    view = NodeView(
        name="a",
        resource_version="2",
        gpus=1,
        taints=({"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"},),
    )
    plan, _ = ctl.reconciler.plan(view)
    assert plan.removed
