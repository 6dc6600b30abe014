"""A deleted agent pod's token stops working at once, against the real kube-apiserver: the
live stream it authenticated is cut, and a reconnect with it is refused, whether the pod is
terminating (graceful delete) or gone (force delete), and even while the API server's own
token cache would still accept it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from gpuhealth.controller.app import Controller
from gpuhealth.protocol import Ack, Error, ErrorCode, encode
from gpuhealth.protocol.codec import decode_controller
from localkube import ControlPlane
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.frames import hello_frame
from tests.support.protocol import XID79, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def connect(url: str, token: str, node: str) -> tuple[aiohttp.ClientSession, Any, Any]:
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {token}"})
    await ws.send_bytes(hello_frame(node, stream=uuid.uuid4().hex))
    async with asyncio.timeout(10):
        reply = decode_controller((await ws.receive()).data)
    return http, ws, reply


async def cut(ws: Any) -> Error:
    """The Error the server sends before it closes the stream."""
    async with asyncio.timeout(10):
        error = None
        while not isinstance(error, Error):  # acks of what was sent before
            msg = await ws.receive()
            assert msg.type is aiohttp.WSMsgType.BINARY, msg
            error = decode_controller(msg.data)
        closing = await ws.receive()
    assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert isinstance(error, Error)
    return error


@pytest.mark.parametrize("grace", [None, 0], ids=["graceful", "force"])
async def test_a_deleted_pods_stream_is_cut_and_its_token_refused(
    kube: Cluster, unique_name: Callable[[str], str], grace: int | None
) -> None:
    node = await kube.node(unique_name("gpu"))
    pod, token = await kube.agent(node)  # the chart's agent ServiceAccount, its namespace
    ns = (await kube.release()).namespace
    ctl: Controller = await kube.controller()
    assert ctl.parts.agent_pods is not None
    await asyncio.wait_for(ctl.parts.agent_pods.watch.synced.wait(), 15)
    server = TestServer(ctl.web_app(), host="127.0.0.1", port=0)
    await server.start_server()
    url = f"ws://127.0.0.1:{server.port}/v1/stream"
    http, ws, reply = await connect(url, token, node)
    try:
        assert reply == Ack(seq=0)
        await ws.send_bytes(encode(snapshot(node, faults={0: XID79}, seq=2)))

        async def tainted() -> bool | None:
            return True if our_taints(await get_node(kube.api, node)) else None

        await until(tainted, "the stream's verdict written")  # the stream really acts

        await client.CoreV1Api(kube.api).delete_namespaced_pod(
            pod.metadata.name, ns, grace_period_seconds=grace
        )
        error = await cut(ws)
        assert error.code == ErrorCode.UNAUTHENTICATED
        assert sum(ctl.parts.stream.metrics.revoked.values()) == 1
        # the same token again, within the API server's own 10 s token cache: refused
        http2, _, again = await connect(url, token, node)
        await http2.close()
        assert isinstance(again, Error) and again.code == ErrorCode.UNAUTHENTICATED
        assert ctl.parts.stream.metrics.rejected["pod_gone"] == 1

        # a new pod on the node, with its own token, is welcome
        _, fresh = await kube.agent(node)
        http3, _, welcome = await connect(url, fresh, node)
        await http3.close()
        assert welcome == Ack(seq=0)
    finally:
        await http.close()
        await server.close()
