"""The stream against the real kube-apiserver: bound-token TokenReview, node binding, outage
and restart replay with real agents (StreamClient + on-disk outbox + token files)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from gpuhealth.agent.stream.client import StreamClient
from gpuhealth.agent.stream.outbox import Outbox
from gpuhealth.agent.stream.settings import BackoffSettings, StreamClientSettings
from gpuhealth.agent.stream.token import TokenFile
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.session import SeqTracker
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.controller.stream.token_review import TokenReviewAuthenticator
from gpuhealth.protocol import (
    Ack,
    Error,
    ErrorCode,
    Event,
)
from gpuhealth.protocol.codec import decode_controller
from localkube import ControlPlane
from localkube.objects import (
    create_gpu_node,
    create_namespace,
    create_pod,
    create_service_account,
    request_bound_token,
)
from tests.integration.chart_identity import install_identity
from tests.support.frames import event_frame, hello_frame
from tests.support.stream import FakeAgentState, RecordingSink, transition
from tests.support.wait import until

pytestmark = pytest.mark.integration

AUDIENCE = "gpuhealth"
SA = "gpuhealth-agent"
FAST = BackoffSettings(initial_s=0.02, max_s=0.2, jitter=0.2)


@dataclass
class Cluster:
    api: client.ApiClient
    ns: str
    nodes: list[str]
    pods: dict[str, Any]
    controller_api: client.ApiClient
    """The chart's controller ServiceAccount and RBAC: what the stream server reviews with."""
    controller_kubeconfig: Path

    async def token(self, node: str, sa: str = SA) -> str:
        return await request_bound_token(self.api, self.ns, sa, self.pods[(node, sa)], AUDIENCE)


@pytest.fixture
async def cluster(
    api_client: client.ApiClient, unique_name: Callable[[str], str], control_plane: ControlPlane
) -> AsyncIterator[Cluster]:
    release = await install_identity(control_plane, api_client)
    controller_api = await make_api_client(str(release.kubeconfig))
    ns = unique_name("ns")
    nodes = [unique_name("gpu") for _ in range(3)]
    await create_namespace(api_client, ns)
    for sa in (SA, "intruder"):
        await create_service_account(api_client, ns, sa)
    pods: dict[Any, Any] = {}
    for i, node in enumerate(nodes):
        await create_gpu_node(api_client, node, kwok=False)
        pods[(node, SA)] = await create_pod(
            api_client, ns, f"agent-{i}", node_name=node, service_account=SA
        )
    pods[(nodes[0], "intruder")] = await create_pod(
        api_client, ns, "intruder", node_name=nodes[0], service_account="intruder"
    )
    try:
        yield Cluster(api_client, ns, nodes, pods, controller_api, release.kubeconfig)
    finally:
        core = client.CoreV1Api(api_client)
        for node in nodes:
            await core.delete_node(node)
        await core.delete_namespace(ns)
        await controller_api.close()
        await release.delete(api_client)


@dataclass
class Controller:
    server: StreamServer
    ts: TestServer
    url: str


async def start_controller(
    cluster: Cluster, sink: RecordingSink, tracker: SeqTracker, port: int = 0
) -> Controller:
    settings = StreamServerSettings(agent_namespace=cluster.ns, agent_service_account=SA)
    auth = TokenReviewAuthenticator(cluster.controller_api, AUDIENCE)  # cached by the server
    server = StreamServer(settings, auth, sink, tracker=tracker)
    app = web.Application()
    server.add_routes(app)
    ts = TestServer(app, host="127.0.0.1", port=port)
    await ts.start_server()
    return Controller(server, ts, f"ws://127.0.0.1:{ts.port}/v1/stream")


async def hello_reply(url: str, token: str, node: str) -> Ack | Error:
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {token}"})
        await ws.send_bytes(hello_frame(node, stream="raw"))
        async with asyncio.timeout(10):
            msg = await ws.receive()
        await ws.close()
        return decode_controller(msg.data)


async def test_bound_token_accepted_only_for_its_node(cluster: Cluster) -> None:
    sink = RecordingSink()
    ctl = await start_controller(cluster, sink, SeqTracker())
    a, b = cluster.nodes[0], cluster.nodes[1]
    try:
        token_a = await cluster.token(a)
        assert await hello_reply(ctl.url, token_a, a) == Ack(seq=0)
        refused = await hello_reply(ctl.url, token_a, b)
        assert isinstance(refused, Error) and refused.code == ErrorCode.FORBIDDEN
        intruder = await hello_reply(ctl.url, await cluster.token(a, "intruder"), a)
        assert isinstance(intruder, Error) and intruder.code == ErrorCode.FORBIDDEN
        garbage = await hello_reply(ctl.url, "not-a-token", a)
        assert isinstance(garbage, Error) and garbage.code == ErrorCode.UNAUTHENTICATED

        # A token never reviewed before, whose pod is then deleted, is refused.
        unseen = await cluster.token(b)
        await client.CoreV1Api(cluster.api).delete_namespaced_pod(
            cluster.pods[(b, SA)].metadata.name, cluster.ns, grace_period_seconds=0
        )
        gone = await hello_reply(ctl.url, unseen, b)
        assert isinstance(gone, Error) and gone.code == ErrorCode.UNAUTHENTICATED

        assert ctl.server.metrics.rejected == {
            "node_mismatch": 1,
            "wrong_service_account": 1,
            "unauthenticated": 2,
        }
        assert [n for n, _ in sink.connects] == [a]
    finally:
        await ctl.ts.close()


def agent(url: str, node: str, state_dir: Path, token_file: Path) -> StreamClient:
    settings = StreamClientSettings(url=url, heartbeat_interval_s=3600, backoff=FAST)
    return StreamClient(
        settings, FakeAgentState(node, gpus=1), Outbox(state_dir), TokenFile(token_file).get
    )


async def test_controller_killed_mid_storm_every_event_once_in_order(
    cluster: Cluster, tmp_path: Path
) -> None:
    sink, tracker = RecordingSink(), SeqTracker()
    ctl = await start_controller(cluster, sink, tracker)
    port = ctl.ts.port
    agents: list[StreamClient] = []
    for node in cluster.nodes:
        token_file = tmp_path / f"{node}.token"
        token_file.write_text(await cluster.token(node))
        agents.append(agent(ctl.url, node, tmp_path / node, token_file))
    tasks = [asyncio.create_task(a.run()) for a in agents]
    per_agent = 300
    try:
        for n in range(1, per_agent + 1):
            for a in agents:
                a.publish(transition(n))
            if n == per_agent // 3:
                await ctl.ts.close()  # the controller dies mid-storm
                await until(lambda: not any(a.metrics.connected for a in agents))
            if n == 2 * per_agent // 3:
                assert all(len(a.outbox) > 0 for a in agents)  # buffered
                ctl = await start_controller(cluster, sink, tracker, port=port)
            await asyncio.sleep(0.001)
        await until(lambda: all(len(a.outbox) == 0 for a in agents))
        for node in cluster.nodes:
            assert sink.xids(node) == list(range(1, per_agent + 1)), node
        assert all(a.metrics.connects >= 2 for a in agents)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ctl.ts.close()


async def test_agent_restart_replays_unacked_events_from_disk(
    cluster: Cluster, tmp_path: Path
) -> None:
    node = cluster.nodes[2]
    token_file = tmp_path / "token"
    token_file.write_text(await cluster.token(node))
    sink, tracker = RecordingSink(), SeqTracker()
    ctl = await start_controller(cluster, sink, tracker)
    port, url = ctl.ts.port, ctl.url
    await ctl.ts.close()  # the controller is down while the agent records a fault

    first = agent(url, node, tmp_path / "state", token_file)
    task = asyncio.create_task(first.run())
    for n in range(1, 6):
        first.publish(transition(n))
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    first.outbox.close()  # the agent process ends with 5 unacknowledged events on disk

    ctl = await start_controller(cluster, sink, tracker, port=port)
    second = agent(url, node, tmp_path / "state", token_file)
    assert len(second.outbox) == 5
    task = asyncio.create_task(second.run())
    try:
        second.publish(transition(6))
        await until(lambda: len(second.outbox) == 0)
        assert sink.xids(node) == [1, 2, 3, 4, 5, 6]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.ts.close()


async def _bad_peer(url: str, token: str, node: str, frames: list[bytes]) -> list[Any]:
    """Send Hello then ``frames``; return every decoded reply until the server closes."""
    out: list[Any] = []
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {token}"})
        await ws.send_bytes(hello_frame(node, stream="bad"))
        for f in frames:
            await ws.send_bytes(f)
        async with asyncio.timeout(10):
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    out.append(decode_controller(msg.data))
        out.append(ws.close_code)
    return out


async def test_bad_frames_from_an_authenticated_peer_do_not_disturb_others(
    cluster: Cluster, tmp_path: Path
) -> None:
    from gpuhealth.protocol import MAX_FRAME_BYTES

    sink = RecordingSink()
    ctl = await start_controller(cluster, sink, SeqTracker())
    a, b = cluster.nodes[0], cluster.nodes[1]
    token_file = tmp_path / "token"
    token_file.write_text(await cluster.token(a))
    healthy = agent(ctl.url, a, tmp_path / "a", token_file)
    task = asyncio.create_task(healthy.run())
    token_b = await cluster.token(b)
    try:
        for n in range(1, 21):
            healthy.publish(transition(n))
        garbage = await _bad_peer(ctl.url, token_b, b, [b"\xc1\xc1\xc1"])
        truncated = await _bad_peer(ctl.url, token_b, b, [event_frame(1, b)[:-5]])
        oversized = await _bad_peer(ctl.url, token_b, b, [b"\x00" * (MAX_FRAME_BYTES + 1)])
        replay = [event_frame(1, b), event_frame(2, b), event_frame(1, b)]
        replayed = await _bad_peer(ctl.url, token_b, b, replay)
        for n in range(21, 41):
            healthy.publish(transition(n))
        await until(lambda: len(healthy.outbox) == 0)

        assert garbage[-2] == Error(code=ErrorCode.MALFORMED, message=garbage[-2].message)
        assert isinstance(truncated[-2], Error) and truncated[-2].code == ErrorCode.MALFORMED
        assert oversized[-1] == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        assert replayed[:3] == [Ack(seq=0), Ack(seq=1), Ack(seq=2)]
        assert isinstance(replayed[3], Error) and replayed[3].code == ErrorCode.OUT_OF_ORDER
        assert [m.xid for n, m in sink.messages if n == b and isinstance(m, Event)] == [1, 2]
        assert sink.xids(a) == list(range(1, 41))
        assert healthy.metrics.connects == 1
        errors = ctl.server.metrics.errors
        assert (errors["malformed"], errors["too-large"], errors["out-of-order"]) == (2, 1, 1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.ts.close()


PROC = Path(__file__).with_name("stream_controller_proc.py")


def _received(path: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            node, xid = line.split()
            out.setdefault(node, []).append(int(xid))
    return out


async def _spawn(cluster: Cluster, port: int, ns: str, out: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROC),
        str(cluster.controller_kubeconfig),
        str(port),
        ns,
        SA,
        str(out),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        assert (await proc.stdout.readline()).strip() == b"ready"
    return proc


async def test_controller_process_sigkilled_mid_storm(
    cluster: Cluster, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """A real crash (SIGKILL, no close frames). The new controller process starts with empty
    state, so what the old one applied but had not acknowledged is delivered to it again:
    each incarnation receives every event at most once and in order, and nothing is lost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"ws://127.0.0.1:{port}/v1/stream"
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    proc = await _spawn(cluster, port, cluster.ns, first_out)
    agents: list[StreamClient] = []
    for node in cluster.nodes:
        token_file = tmp_path / f"{node}.token"
        token_file.write_text(await cluster.token(node))
        agents.append(agent(url, node, tmp_path / node, token_file))
    tasks = [asyncio.create_task(a.run()) for a in agents]
    total = 300
    try:
        for n in range(1, total + 1):
            for a in agents:
                a.publish(transition(n))
            if n == total // 3:
                proc.kill()
                await proc.wait()
            if n == 2 * total // 3:
                assert all(len(a.outbox) > 0 for a in agents)
                proc = await _spawn(cluster, port, cluster.ns, second_out)
            await asyncio.sleep(0.001)
        await until(lambda: all(len(a.outbox) == 0 for a in agents), timeout_s=30)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        proc.kill()
        await proc.wait()
    first, second = _received(first_out), _received(second_out)
    for node in cluster.nodes:
        old, new = first.get(node, []), second.get(node, [])
        assert old == sorted(set(old)) and new == sorted(set(new)), node  # once, in order
        assert old and new
        assert sorted(set(old) | set(new)) == list(range(1, total + 1)), node  # none lost
        replayed = [x for x in new if x <= old[-1]]
        assert replayed == old[len(old) - len(replayed) :], node  # only the unacked tail
