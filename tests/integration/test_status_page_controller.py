"""The status page of a real controller (``compose.build_controller``): taints come from its node
watch cache over the real API server, the breaker and fleet from the controller itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpuhealth.controller.status_page import OVERVIEW_PATH
from localkube import ControlPlane
from tests.integration.chromium_support import dump_dom
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import fault
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def test_page_on_a_controller_shows_real_taints(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    bad, good = await kube.node(unique_name("web-bad")), await kube.node(unique_name("web-ok"))
    ctl = await kube.controller({"breaker": {"max_fraction": 1.0}})
    server = TestServer(ctl.web_app(), host="127.0.0.1")
    await server.start_server()
    try:
        for name in (bad, good):
            connect(ctl.parts.fleet, name)
        ctl.parts.fleet.on_message(bad, fault(bad, 1))

        async def tainted() -> bool | None:
            return True if our_taints(await get_node(kube.api, bad)) else None

        await until(tainted, "the reconciler's taint on the API server")

        async def overview() -> dict[str, Any] | None:
            url = str(server.make_url(OVERVIEW_PATH))
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                doc: dict[str, Any] = await resp.json()
            nodes = {n["name"]: n for n in doc["nodes"]}
            return doc if nodes.get(bad, {}).get("taints") else None

        doc = await until(overview, "the taint in the page's overview (node watch cache)")
        nodes = {n["name"]: n for n in doc["nodes"]}
        assert nodes[bad]["taints"] == ["gpuhealth.io/unhealthy=xid-79:NoSchedule"]
        assert nodes[bad]["gpus"][1]["state"] == "unhealthy"
        assert nodes[good]["taints"] == [] and nodes[good]["state"] == "healthy"
        assert doc["breaker"]["open"] is False and doc["breaker"]["enabled"] is True
        messages = [e["message"] for e in doc["events"] if e["node"] == bad]
        assert "tainted gpuhealth.io/unhealthy=xid-79:NoSchedule" in messages

        dom = await dump_dom(str(server.make_url("/")))
        assert f'data-node="{bad}" data-gpu="1" data-state="unhealthy"' in dom
    finally:
        await server.close()
