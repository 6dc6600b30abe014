"""DRA device taints, leader election and restarts against a real kube-apiserver."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import request
from localkube import ControlPlane
from tests.integration.controller_helpers import (
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    gpu_condition,
    our_taints,
)
from tests.support.fleet import connect
from tests.support.protocol import XID79, fault, gpu_uuid, hello, recovery, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def _rules_for(kube: Cluster, node: str) -> list[dict[str, Any]]:
    data = await request(
        kube.api, "GET", RULES, query=[("labelSelector", "gpuhealth.io/managed=true")]
    )
    return [
        r
        for r in data.get("items") or []
        if r["metadata"].get("annotations", {}).get("gpuhealth.io/node") == node
    ]


async def test_dra_device_taint_rule_follows_the_gpu(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    name = await kube.node(unique_name("gpu-dra"))
    slice_body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": gpu_uuid(i, name)}}}
                for i in range(2)
            ],
        },
    }
    await request(kube.api, "POST", "/apis/resource.k8s.io/v1/resourceslices", body=slice_body)
    try:
        ctl = await kube.controller()
        connect(ctl.parts.fleet, name)
        ctl.parts.fleet.on_message(name, fault(name, 1))

        async def rule() -> list[dict[str, Any]] | None:
            rules = await _rules_for(kube, name)
            return rules or None

        rules = await until(rule, "a DeviceTaintRule")
        assert ctl.parts.dra is not None and ctl.parts.dra.rule_version == "v1beta2"
        assert len(rules) == 1
        spec = rules[0]["spec"]
        assert spec["deviceSelector"] == {
            "driver": "gpu.nvidia.com",
            "pool": name,
            "device": "gpu-1",
        }
        assert spec["taint"]["key"] == UNHEALTHY and spec["taint"]["value"] == "xid-79"
        assert spec["taint"]["effect"] == "NoSchedule"

        ctl.parts.fleet.on_message(name, recovery(name, 1))

        async def gone() -> bool | None:
            return True if not await _rules_for(kube, name) else None

        await until(gone, "the rule removed on recovery")
    finally:
        await request(
            kube.api, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}-gpu.nvidia.com"
        )


async def test_leader_failover_within_15s_no_taint_lost_or_duplicated(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    a_node = await kube.node(unique_name("gpu-a"))
    b_node = await kube.node(unique_name("gpu-b"))
    leader_cfg = {
        "leader": {
            "enabled": True,  # the release's Lease
            "lease_duration_s": 4,
            "renew_deadline_s": 3.0,
            "retry_period_s": 1.0,
        }
    }
    one = await kube.controller(leader_cfg, identity="one")
    await until(lambda: _flag(one.is_leader), "first leader")
    two = await kube.controller(leader_cfg, identity="two")
    for ctl in (one, two):  # agents reach both (the replay after reconnect, in effect)
        for n in (a_node, b_node):
            connect(ctl.parts.fleet, n)
        ctl.parts.fleet.on_message(a_node, fault(a_node, 0))
    await until(lambda: _has_taint(kube, a_node), "taint from the first leader")
    assert not two.is_leader

    await kube.stop(one, crash=True)
    assert not one.is_leader  # its leader work stopped with it: nothing writes behind our back
    t0 = time.monotonic()
    await until(lambda: _flag(two.is_leader), "takeover", timeout_s=15.0)
    took = time.monotonic() - t0
    assert took < 15.0
    two.parts.fleet.on_message(b_node, fault(b_node, 1))
    await until(lambda: _has_taint(kube, b_node), "taint from the new leader")
    await kube.settle(two)
    for n in (a_node, b_node):
        node = await get_node(kube.api, n)
        assert our_taints(node) == [(UNHEALTHY, "xid-79", "NoSchedule")]
        keys = [(t["key"], t["effect"]) for t in node["spec"]["taints"]]
        assert len(keys) == len(set(keys))


async def _flag(v: bool) -> bool | None:
    return True if v else None


async def _has_taint(kube: Cluster, name: str) -> bool | None:
    return True if our_taints(await get_node(kube.api, name)) else None


async def test_restart_with_taints_in_place_writes_nothing(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    names = [await kube.node(unique_name(f"gpu-r{i}")) for i in range(3)]
    no_breaker = {"breaker": {"enabled": False}}
    first = await kube.controller(no_breaker)
    for n in names:
        first.parts.fleet.on_connect(n, hello(n))
        first.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))

    async def all_done() -> bool | None:
        nodes = [await get_node(kube.api, n) for n in names]
        ok = all(our_taints(x) and gpu_condition(x) for x in nodes)
        return True if ok else None

    await until(all_done, "taints and conditions on every node")
    await kube.settle(first)
    await kube.stop(first)
    before = {n: (await get_node(kube.api, n))["metadata"]["resourceVersion"] for n in names}

    second = await kube.controller(no_breaker)
    writes: list[Any] = []
    second.parts.reconciler.on_plan = writes.append
    await kube.settle(second)  # no data yet: nothing may change
    for n in names:
        second.parts.fleet.on_connect(n, hello(n))
    await kube.settle(second)
    for n in names:  # the agents' snapshots arrive, one GPU still unhealthy
        second.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await kube.settle(second)
    after = {n: (await get_node(kube.api, n))["metadata"]["resourceVersion"] for n in names}
    assert writes == []
    assert after == before
