"""The controller against a real kube-apiserver: taints, labels, condition, Events, safety."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import ConflictError, NotFoundError, request
from localkube import ControlPlane
from tests.integration.controller_helpers import (
    EXCLUDE,
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    gpu_condition,
    our_taints,
)
from tests.support.fleet import connect
from tests.support.protocol import DBE, XID79, fault, hello, recovery, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def node_events(kube: Cluster, node: str) -> set[str]:
    data = await request(
        kube.api,
        "GET",
        "/api/v1/namespaces/default/events",
        query=[("fieldSelector", f"involvedObject.name={node}")],
    )
    return {e["reason"] for e in data.get("items") or []}


async def test_fault_taints_labels_condition_events_then_recovery(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    name = await kube.node(
        unique_name("gpu"), taints=[{"key": "other.io/x", "effect": "NoSchedule"}]
    )
    ctl = await kube.controller()
    connect(ctl.parts.fleet, name)

    async def healthy() -> dict[str, Any] | None:
        n = await get_node(kube.api, name)
        c = gpu_condition(n)
        return n if c and c["status"] == "True" else None

    n = await until(healthy, "GPUHealthy=True")
    assert n["metadata"]["labels"][f"{PREFIX}/state"] == "healthy"
    assert n["metadata"]["labels"][f"{PREFIX}/healthy-gpus"] == "2"
    assert our_taints(n) == []

    ctl.parts.fleet.on_message(name, fault(name, 1))

    async def tainted() -> dict[str, Any] | None:
        n = await get_node(kube.api, name)
        c = gpu_condition(n)
        return n if our_taints(n) and c and c["status"] == "False" else None

    n = await until(tainted, "taint and condition")
    assert our_taints(n) == [(UNHEALTHY, "xid-79", "NoSchedule")]
    assert {"key": "other.io/x", "effect": "NoSchedule"} in n["spec"]["taints"]
    assert n["metadata"]["labels"][f"{PREFIX}/state"] == "unhealthy"
    assert n["metadata"]["labels"][f"{PREFIX}/healthy-gpus"] == "1"
    cond = gpu_condition(n)
    assert cond is not None and cond["reason"] == "XidError" and "GPU 1" in cond["message"]

    async def events() -> set[str] | None:
        got = await node_events(kube, name)
        return got if {"GPUUnhealthy", "NodeTainted"} <= got else None

    await until(events, "GPUUnhealthy and NodeTainted events")

    ctl.parts.fleet.on_message(name, recovery(name, 1))

    async def untainted() -> dict[str, Any] | None:
        n = await get_node(kube.api, name)
        c = gpu_condition(n)
        return n if not our_taints(n) and c and c["status"] == "True" else None

    n = await until(untainted, "untaint")
    assert {"key": "other.io/x", "effect": "NoSchedule"} in n["spec"]["taints"]

    async def recovered() -> set[str] | None:
        got = await node_events(kube, name)
        return got if {"GPURecovered", "NodeUntainted"} <= got else None

    await until(recovered, "GPURecovered and NodeUntainted events")


async def _foreign_writer(kube: Cluster, node: str, count: int) -> int:
    """Add ``count`` foreign taints by read-modify-write with resourceVersion, like kubectl."""
    conflicts = 0
    for i in range(count):
        while True:
            n = await get_node(kube.api, node)
            taints = list(n["spec"].get("taints") or [])
            taints.append({"key": f"example.com/t{i}", "value": "v", "effect": "NoSchedule"})
            body = {
                "metadata": {"resourceVersion": n["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                await request(
                    kube.api,
                    "PATCH",
                    f"/api/v1/nodes/{node}",
                    body=body,
                    content_type="application/merge-patch+json",
                )
                break
            except ConflictError:
                conflicts += 1
    return conflicts


@pytest.mark.parametrize("kwok_node", [False, True], ids=["plain", "kwok"])
async def test_foreign_taints_survive_a_concurrent_writer(
    kube: Cluster,
    unique_name: Callable[[str], str],
    kwok_node: bool,
    request: pytest.FixtureRequest,
) -> None:
    if kwok_node:
        request.getfixturevalue("kwok")
    name = await kube.node(unique_name("gpu"), kwok=kwok_node)
    ctl = await kube.controller()
    connect(ctl.parts.fleet, name)
    writer = asyncio.create_task(_foreign_writer(kube, name, 30))
    for i in range(12):
        cond = XID79 if i % 2 == 0 else DBE
        ctl.parts.fleet.on_message(name, fault(name, 0, cond) if i % 3 != 2 else recovery(name, 0))
        await asyncio.sleep(0.05)
    ctl.parts.fleet.on_message(name, fault(name, 0, DBE))
    await writer
    await kube.settle(ctl)
    n = await get_node(kube.api, name)
    foreign = {t["key"] for t in n["spec"]["taints"] if t["key"].startswith("example.com/")}
    assert foreign == {f"example.com/t{i}" for i in range(30)}
    assert our_taints(n) == [(UNHEALTHY, "ecc-dbe", "NoSchedule")]


async def test_dry_run_writes_nothing(kube: Cluster, unique_name: Callable[[str], str]) -> None:
    name = await kube.node(unique_name("gpu"))
    before = await get_node(kube.api, name)
    ctl = await kube.controller({"dry_run": True})
    plans: list[Any] = []
    ctl.parts.reconciler.on_plan = plans.append
    connect(ctl.parts.fleet, name)
    ctl.parts.fleet.on_message(name, fault(name, 0))

    async def planned() -> bool | None:
        return True if any(p.node == name and p.added for p in plans) else None

    await until(planned, "a dry-run plan that adds the taint")
    await kube.settle(ctl)
    after = await get_node(kube.api, name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert await node_events(kube, name) == set()


async def test_exclude_label_opts_out_and_clears_our_taints(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    excluded = await kube.node(unique_name("gpu-ex"), labels={EXCLUDE: "true"})
    name = await kube.node(unique_name("gpu"))
    ctl = await kube.controller()
    for n in (excluded, name):
        ctl.parts.fleet.on_connect(n, hello(n))
        ctl.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await until(lambda: _tainted(kube, name), "taint on the managed node")
    await kube.settle(ctl)
    ex = await get_node(kube.api, excluded)
    assert our_taints(ex) == []
    assert gpu_condition(ex) is None
    # excluding a tainted node removes gpuhealth's taints from it
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        body={"metadata": {"labels": {EXCLUDE: "true"}}},
        content_type="application/merge-patch+json",
    )
    await until(lambda: _untainted(kube, name), "taint removed after exclusion")


async def _tainted(kube: Cluster, name: str) -> bool | None:
    return True if our_taints(await get_node(kube.api, name)) else None


async def _untainted(kube: Cluster, name: str) -> bool | None:
    return True if not our_taints(await get_node(kube.api, name)) else None


async def test_taint_removed_by_hand_is_acknowledged_not_fought(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    name = await kube.node(unique_name("gpu"))
    ctl = await kube.controller()
    ctl.parts.fleet.on_connect(name, hello(name))
    ctl.parts.fleet.on_message(name, snapshot(name, faults={0: XID79}))
    await until(lambda: _tainted(kube, name), "taint")
    await kube.settle(ctl)  # its condition write done too: the hand edit below is not raced
    n = await get_node(kube.api, name)
    body = {
        "metadata": {"resourceVersion": n["metadata"]["resourceVersion"]},
        "spec": {"taints": [t for t in n["spec"]["taints"] if t["key"] != UNHEALTHY]},
    }
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        body=body,
        content_type="application/merge-patch+json",
    )

    assert ctl.parts.incidents is not None
    book = ctl.parts.incidents.book
    (override,) = await until(lambda: book.list(kind="override"), "an override incident")
    assert override.subjects.nodes == (name,)
    await kube.settle(ctl)
    n = await get_node(kube.api, name)
    assert our_taints(n) == []
    assert f"{PREFIX}/acknowledged-taints" not in (n["metadata"].get("annotations") or {})
    # a new verdict (a different taint value) taints again, and the override ends
    ctl.parts.fleet.on_message(name, fault(name, 0, DBE))

    async def retainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, name)) else None

    await until(retainted, "taint for the new verdict")
    assert our_taints(await get_node(kube.api, name)) == [(UNHEALTHY, "ecc-dbe", "NoSchedule")]
    assert book.list(kind="override") == []


async def test_breaker_trips_in_a_storm_of_half_the_nodes(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    names = await asyncio.gather(*(kube.node(unique_name(f"storm{i}")) for i in range(40)))
    ctl = await kube.controller({"breaker": {"max_fraction": 0.1, "window_s": 600}})
    for n in names:
        connect(ctl.parts.fleet, n)
    await kube.settle(ctl)
    limit = ctl.parts.breaker.limit(ctl.parts.gate.gpu_nodes())
    assert 0 < limit < 20
    for n in names[:20]:
        ctl.parts.fleet.on_message(n, fault(n, 0))
    await kube.settle(ctl)
    nodes = [await get_node(kube.api, n) for n in names]
    tainted = [n for n in nodes if our_taints(n)]
    assert len(tainted) == limit
    assert ctl.parts.breaker.is_open
    # conditions and labels still tell the truth on blocked nodes
    assert all(gpu_condition(n)["status"] == "False" for n in nodes[:20])  # type: ignore[index]
    text = (await _metrics(ctl)).splitlines()
    assert "gpuhealth_circuit_breaker_open 1.0" in text
    assert "gpuhealth_circuit_breaker_trips_total 1.0" in text
    # recovery is never blocked
    first = tainted[0]["metadata"]["name"]
    ctl.parts.fleet.on_message(first, recovery(first, 0))
    await until(lambda: _untainted(kube, first), "untaint while the breaker is open")
    # operator reset: the blocked nodes are taken up again (and the breaker re-trips)
    ctl.parts.gate.reset(by="test")
    await kube.settle(ctl)
    nodes = [await get_node(kube.api, n) for n in names]
    assert len([n for n in nodes if our_taints(n)]) == 2 * limit - 1
    assert ctl.parts.breaker.trips == 2


async def _metrics(ctl: Any) -> str:
    from prometheus_client import generate_latest

    return generate_latest(ctl.parts.registry).decode()


async def test_open_breaker_survives_a_new_leader_and_closes_from_its_configmap(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    release = await kube.release()
    cm = release.config["breaker"]["configmap"]  # the only one the chart's Role may touch
    settings = {
        "breaker": {
            "max_fraction": 0.0,
            "min_nodes": 1,
            "sync_interval_s": 0.1,
            "poll_interval_s": 0.2,
        }
    }
    names = [await kube.node(unique_name(f"gpu-b{i}")) for i in range(3)]
    first = await kube.controller(settings)
    for n in names:
        first.parts.fleet.on_connect(n, hello(n))
        first.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await kube.settle(first)
    assert first.parts.breaker.is_open

    async def stored_open() -> bool | None:
        path = f"/api/v1/namespaces/{release.namespace}/configmaps/{cm}"
        try:
            data = await request(kube.api, "GET", path)
        except NotFoundError:
            return None  # not written yet (every sync_interval_s)
        return True if data["data"]["state"] == "open" else None

    await until(stored_open, "the open state in the ConfigMap")
    await kube.stop(first)

    second = await kube.controller(settings)
    for n in names:
        second.parts.fleet.on_connect(n, hello(n))
        second.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await kube.settle(second)
    assert second.parts.breaker.is_open
    tainted = [n for n in names if our_taints(await get_node(kube.api, n))]
    assert len(tainted) == 1  # nothing beyond the first leader's one allowed taint
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/namespaces/{release.namespace}/configmaps/{cm}",
        body={"data": {"state": "closed"}},
        content_type="application/merge-patch+json",
    )

    async def reset() -> bool | None:
        return True if second.parts.breaker.trips >= 2 or not second.parts.breaker.is_open else None

    await until(reset, "the breaker closed from the ConfigMap")
    await kube.settle(second)
    assert len([n for n in names if our_taints(await get_node(kube.api, n))]) == 2


async def test_the_breaker_window_survives_a_restart(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """A budget of two nodes: the first controller taints one and stores its window; the
    controller restarts (a crash loop would too) and of two more faulty nodes only one is
    tainted before the breaker opens: the restart gave no fresh budget."""
    release = await kube.release()
    cm = release.config["breaker"]["configmap"]
    settings = {"breaker": {"max_fraction": 0.0, "min_nodes": 2, "sync_interval_s": 0.1}}
    names = [await kube.node(unique_name(f"gpu-w{i}")) for i in range(3)]
    first = await kube.controller(settings)
    first.parts.fleet.on_connect(names[0], hello(names[0]))
    first.parts.fleet.on_message(names[0], snapshot(names[0], faults={0: XID79}))
    await kube.settle(first)
    assert our_taints(await get_node(kube.api, names[0]))

    async def stored_window() -> str | None:
        path = f"/api/v1/namespaces/{release.namespace}/configmaps/{cm}"
        try:
            data = await request(kube.api, "GET", path)
        except NotFoundError:
            return None
        window = str((data.get("data") or {}).get("window", ""))
        return window if names[0] in window else None

    await until(stored_window, "the window in the ConfigMap")
    await kube.stop(first)

    second = await kube.controller(settings)
    for n in names[1:]:
        second.parts.fleet.on_connect(n, hello(n))
        second.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await kube.settle(second)
    tainted = [n for n in names[1:] if our_taints(await get_node(kube.api, n))]
    assert len(tainted) == 1 and second.parts.breaker.is_open


async def test_silent_agent_makes_the_node_unknown_and_keeps_its_taint(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    name = await kube.node(unique_name("gpu"))
    ctl = await kube.controller({"fleet": {"agent_timeout_s": 1.0, "stale_check_interval_s": 0.1}})
    ctl.parts.fleet.on_connect(name, hello(name))
    ctl.parts.fleet.on_message(name, snapshot(name, faults={0: XID79}))
    await until(lambda: _tainted(kube, name), "taint")
    ctl.parts.fleet.on_disconnect(name)

    async def unknown() -> dict[str, Any] | None:
        n = await get_node(kube.api, name)
        c = gpu_condition(n)
        return n if c and c["status"] == "Unknown" else None

    n = await until(unknown, "GPUHealthy=Unknown after the agent went silent")
    assert gpu_condition(n)["reason"] == "AgentNotReporting"  # type: ignore[index]
    assert n["metadata"]["labels"][f"{PREFIX}/state"] == "unknown"
    assert our_taints(n) == [(UNHEALTHY, "xid-79", "NoSchedule")]
    text = await _metrics(ctl)
    assert 'gpuhealth_nodes{state="unknown"} 1.0' in text
