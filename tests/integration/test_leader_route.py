"""The test route (:mod:`tests.integration.leader_route`) against a real API server: one
listener per shard follows that shard's Service's EndpointSlice as the product's
:class:`~gpuhealth.controller.leadership.endpoint.LeaderEndpoint` writes it; a shard without
an endpoint refuses, a moved one sends new connections to its new owner while an open one
stays, and one shard is exactly the leader's Service."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.leadership.endpoint import LeaderEndpoint
from gpuhealth.controller.shards.leases import shard_service_name
from localkube.objects import create_namespace
from localkube.process import free_port
from tests.integration.leader_route import LeaderRoute, ShardEndpoints
from tests.support.wait import until

pytestmark = pytest.mark.integration

PODS = {"10.9.0.1": "127.0.0.21", "10.9.0.2": "127.0.0.22", "10.9.0.3": "127.0.0.23"}
"""The replicas' pod IPs (in the slices) and the loopback address each listens on."""


@asynccontextmanager
async def _replicas(port: int) -> AsyncIterator[None]:
    """A stand-in for each replica on its own address: says its pod IP on every connection,
    then echoes (so a test sees where a connection went, and that it stays there)."""
    servers = []
    for ip, host in PODS.items():

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, ip: str = ip) -> None:
            w.write(f"{ip}\n".encode())
            with contextlib.suppress(OSError):
                while data := await r.read(1024):
                    w.write(data)
                    await w.drain()
            w.close()

        servers.append(await asyncio.start_server(serve, host, port))
    try:
        yield
    finally:
        for s in servers:
            s.close()
            await s.wait_closed()


async def _service(api: Any, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
    }
    await request(api, "POST", f"/api/v1/namespaces/{namespace}/services", body=body)


async def _reached(route: LeaderRoute, shard: int) -> str | None:
    """The pod a new connection to ``shard``'s listener reached; None when it was refused
    (closed at once)."""
    reader, writer = await asyncio.open_connection(route.host(shard), route.port)
    try:
        line = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
    return line.decode().strip() or None


async def test_each_shard_follows_its_own_owner_and_one_shard_is_the_leader(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("route")
    await create_namespace(api_client, ns)
    port = free_port()
    svc, shards = "ctl", 3
    for i in range(shards):
        await _service(api_client, ns, shard_service_name(svc, i))
    await _service(api_client, ns, svc)

    def owner(shard: int, ip: str, service: str | None = None) -> LeaderEndpoint:
        name = service or shard_service_name(svc, shard)
        return LeaderEndpoint(
            api_client, namespace=ns, service=name, pod_name=f"p-{ip}", pod_ip=ip, port=port
        )

    ips = list(PODS)
    async with (
        _replicas(port),
        LeaderRoute(api_client, ns, svc, PODS, shards).running() as route,
    ):
        # no slice yet: every shard refuses at once
        assert [await _reached(route, i) for i in range(shards)] == [None] * shards
        assert route.refused == shards
        # each shard's owner publishes: each listener reaches its own
        for i in range(shards):
            await owner(i, ips[i]).publish()
        await until(lambda: all(route.endpoints.targets) or None, "every shard's slice read")
        assert [await _reached(route, i) for i in range(shards)] == ips
        assert route.routed_to_shard == {0: 1, 1: 1, 2: 1}
        assert route.routed == {(ip, port): 1 for ip in ips}
        assert route.url_of(2) == route.url_template.format(shard=2)
        assert route.url_of(2) == f"ws://{route.host(2)}:{route.port}/v1/stream"

        # a connection open to shard 1's owner stays with it while the shard moves
        reader, writer = await asyncio.open_connection(route.host(1), route.port)
        assert (await reader.readline()).decode().strip() == ips[1]
        await owner(1, ips[1]).withdraw()
        await until(lambda: route.endpoints.targets[1] is None or None, "shard 1 withdrawn")
        assert await _reached(route, 1) is None  # refused, as a Service without endpoints
        assert await _reached(route, 0) == ips[0]  # the others untouched
        await owner(1, ips[0]).publish()  # taken over by shard 0's owner
        await until(lambda: route.endpoints.address(1) == (PODS[ips[0]], port) or None, "moved")
        assert await _reached(route, 1) == ips[0]
        writer.write(b"still here\n")
        assert (await reader.readline()) == b"still here\n"
        writer.close()

        # one shard is exactly today's controller: the leader's own slice
        await owner(0, ips[2], service=svc).publish()
        async with ShardEndpoints(api_client, ns, svc, PODS, 1).following() as leader:
            assert leader.targets == [(ips[2], port)]
            assert leader.address(0) == (PODS[ips[2]], port)
