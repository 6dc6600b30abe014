"""One gate for every hard write, against a real kube-apiserver with DRA served: a
false-positive storm writes no DeviceTaintRule and no NoExecute taint while the breaker is
open, and a reset takes the blocked nodes up again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.kube.rest import request
from localkube import ControlPlane
from tests.integration.controller_helpers import UNHEALTHY, Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import DBE, XID79, fault, gpu_uuid
from tests.support.wait import until

pytestmark = pytest.mark.integration

RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def _slice(kube: Cluster, node: str) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": gpu_uuid(i, node)}}}
                for i in range(2)
            ],
        },
    }
    await request(kube.api, "POST", SLICES, body=body)


async def _rule_nodes(kube: Cluster, nodes: list[str]) -> set[str]:
    data = await request(
        kube.api, "GET", RULES, query=[("labelSelector", "gpuhealth.io/managed=true")]
    )
    owners = {
        (r["metadata"].get("annotations") or {}).get("gpuhealth.io/node")
        for r in data.get("items") or []
    }
    return {n for n in nodes if n in owners}


async def _dra_settled(ctl: Controller) -> None:
    dra = ctl.parts.dra
    assert dra is not None
    await until(lambda: len(dra.queue) == 0 and dra.queue.processing == 0, "DRA idle", timeout_s=30)


async def test_a_storm_with_dra_writes_no_device_taint_while_the_breaker_is_open(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    names = list(await asyncio.gather(*(kube.node(unique_name(f"dstorm{i}")) for i in range(10))))
    await asyncio.gather(*(_slice(kube, n) for n in names))
    try:
        ctl = await kube.controller({"breaker": {"max_fraction": 0.0, "min_nodes": 2}})
        dra = ctl.parts.dra
        assert dra is not None
        await until(lambda: dra.rule_version is not None, "DRA discovered", timeout_s=30)
        for n in names:
            connect(ctl.parts.fleet, n)
        await kube.settle(ctl)
        for n in names:  # the storm: GPU 1 of every node at once
            ctl.parts.fleet.on_message(n, fault(n, 1))
        await kube.settle(ctl)
        # DRA asked the gate for every node; it was refused for every node the breaker did
        # not admit (the two it admitted get their whole verdict: node taint and rule)
        with_rules: set[str] = set()

        async def all_asked() -> bool | None:
            nonlocal with_rules
            with_rules = await _rule_nodes(kube, names)
            return True if dra.blocked | with_rules == set(names) else None

        await until(all_asked, "DRA to ask the gate for every node")
        await _dra_settled(ctl)
        assert ctl.parts.breaker.is_open
        tainted = {n for n in names if our_taints(await get_node(kube.api, n))}
        with_rules = await _rule_nodes(kube, names)
        assert tainted == with_rules and len(tainted) == 2  # one budget, shared
        assert dra.blocked == set(names) - with_rules

        ctl.parts.gate.reset(by="test")  # the operator's reset takes blocked nodes up again
        await kube.settle(ctl)
        await _dra_settled(ctl)

        async def more_rules() -> set[str] | None:
            got = await _rule_nodes(kube, names)
            return got if len(got) > len(with_rules) else None

        await until(more_rules, "DeviceTaintRules after the reset")
        await _dra_settled(ctl)
        assert ctl.parts.breaker.trips == 2
        tainted = {n for n in names if our_taints(await get_node(kube.api, n))}
        assert tainted == await _rule_nodes(kube, names) and len(tainted) == 4
    finally:
        for n in names:
            await request(kube.api, "DELETE", f"{SLICES}/{n}-gpu.nvidia.com")


async def test_noexecute_on_a_cordoned_node_waits_while_the_breaker_is_open(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    cordoned, a, b = [await kube.node(unique_name(f"noexec{i}")) for i in range(3)]
    ctl = await kube.controller(
        {
            "breaker": {"max_fraction": 0.0, "min_nodes": 1, "window_s": 1.0},
            "policy": {"noexecute_codes": ["xid-79"]},
            "dra": {"enabled": False},
        }
    )
    connect(ctl.parts.fleet, cordoned, faults={0: DBE})
    connect(ctl.parts.fleet, a)
    connect(ctl.parts.fleet, b)
    await kube.settle(ctl)

    async def node_taints(name: str) -> list[tuple[str, str, str]]:
        return our_taints(await get_node(kube.api, name))

    assert await node_taints(cordoned) == [(UNHEALTHY, "ecc-dbe", "NoSchedule")]

    async def window_passed() -> bool | None:
        return True if ctl.parts.breaker.status().recent_nodes == 0 else None

    await until(window_passed, "the breaker's window to pass")
    ctl.parts.fleet.on_message(a, fault(a, 0, DBE))
    ctl.parts.fleet.on_message(b, fault(b, 0, DBE))  # trips the breaker (limit 1)
    await kube.settle(ctl)
    assert ctl.parts.breaker.is_open
    ctl.parts.fleet.on_message(cordoned, fault(cordoned, 1, XID79))
    await kube.settle(ctl)
    have: list[Any] = await node_taints(cordoned)
    assert (UNHEALTHY, "xid-79", "NoExecute") not in have  # no eviction while open
    ctl.parts.gate.reset(by="test")

    async def evicting() -> bool | None:
        return True if (UNHEALTHY, "xid-79", "NoExecute") in await node_taints(cordoned) else None

    await until(evicting, "NoExecute once the breaker is reset")
