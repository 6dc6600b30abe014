"""Leader election through an API-server outage, with the real kube-apiserver stopped and
started again (its own control plane: the session's stays up): the elector never crashes,
the leader stops acting once its renew deadline passes, and a replica leads again after."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.breaker.gate import HardWrite
from localkube import ControlPlane
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import fault
from tests.support.wait import until

pytestmark = pytest.mark.integration

OUTAGE_S = 12.0
"""Longer than the renew deadline (10 s): the leader must give the lead up during it."""


@pytest.fixture
async def own_cp(kube_assets: Path) -> AsyncIterator[ControlPlane]:
    cp = ControlPlane(kube_assets)
    await cp.astart()
    try:
        yield cp
    finally:
        await cp.astop()


@pytest.fixture
async def kube(own_cp: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(own_cp) as c:
        yield c


def leaders(ctls: list[Controller]) -> list[Controller]:
    return [c for c in ctls if c.is_leader]


async def test_the_lead_survives_an_api_server_outage(kube: Cluster, own_cp: ControlPlane) -> None:
    settings = {"leader": {"enabled": True}}  # the release's Lease, the chart's RBAC
    ctls = [await kube.controller(settings, identity=f"replica-{i}") for i in range(2)]
    first = (await until(lambda: leaders(ctls), "a leader"))[0]

    began = time.monotonic()
    await asyncio.to_thread(own_cp.stop_apiserver)
    # nobody acts once the renew deadline passed without a renewal
    await until(lambda: not leaders(ctls), "the leader to stop leading", timeout_s=OUTAGE_S)
    for c in ctls:  # the election task does not crash: it keeps trying
        assert c.supervisor.status()["leader-election"]["failures"] == 0
    assert first.parts.elector.losses == 1
    refused = first.parts.gate.request(HardWrite("any-node", "node-taint"))
    assert (refused.allowed, refused.reason) == (False, "NotLeader")
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
    assert not leaders(ctls)
    await asyncio.to_thread(own_cp.start_apiserver)
    back = time.monotonic()

    leader = (await until(lambda: leaders(ctls), "a leader again", timeout_s=30))[0]
    regained_s = time.monotonic() - back
    assert regained_s < leader.parts.cfg.leader.lease_duration_s
    for c in ctls:  # the election task never crashed; it kept trying
        assert c.supervisor.status()["leader-election"]["failures"] == 0
        assert c.supervisor.healthy()
    text = generate_latest(first.parts.registry).decode()
    assert "gpuhealth_controller_leadership_lost_total 1.0" in text

    # the new lead acts: a fault is tainted
    node = await kube.node(f"after-outage-{uuid.uuid4().hex[:6]}")
    connect(leader.parts.fleet, node)
    leader.parts.fleet.on_message(node, fault(node, 0))

    async def tainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, node)) else None

    await until(tainted, "a taint from the leader after the outage", timeout_s=30)
