"""A Service-like route to the controller's leader, for tests that run the replicas as
processes on 127.0.0.1 (no kube-proxy there).

The chart's controller Service has no selector: the leader keeps its one EndpointSlice,
``<service>-leader``, pointing at its own pod IP and port
(:mod:`gpuhealth.controller.leadership.endpoint`). :class:`LeaderRoute` does for a test what
kube-proxy does for that Service: it follows the slice on the real API server (read every
``POLL_S``) and sends each new TCP connection to the address
the slice names *when the connection arrives*, through ``pods``: the API server refuses a
loopback address in an EndpointSlice, so the replicas publish pod IPs of their own and the
route maps each to the loopback address that replica listens on (the pod network, on
127.0.0.0/8); a connection already open stays with its
backend until one side closes it (a killed leader's kernel closes it). While the slice is
empty or missing a connection is closed at once (refused), as a Service without endpoints
is. Each backend's connections are counted (:attr:`routed`), so a test sees that the agents
reached the successor through the route.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from gpuhealth.controller.kube.rest import ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.leadership.endpoint import slice_name
from localkube.process import free_port

POLL_S = 0.05
"""How often the route reads the slice (kube-proxy follows a watch; a read every 50 ms on
127.0.0.1 is as prompt and needs no resourceVersion bookkeeping)."""
CHUNK = 65_536


def backend(endpoint_slice: dict[str, Any]) -> tuple[str, int] | None:
    """The (address, port) the slice sends traffic to; None when it names none (pure)."""
    addresses = [
        a
        for e in endpoint_slice.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready", True)
        for a in e.get("addresses") or []
    ]
    ports = [p["port"] for p in endpoint_slice.get("ports") or [] if p.get("port")]
    return (addresses[0], int(ports[0])) if addresses and ports else None


class LeaderRoute:
    def __init__(
        self, api: ApiClient, namespace: str, service: str, pods: Mapping[str, str]
    ) -> None:
        self._api = api
        self._pods = dict(pods)
        self._path = (
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{slice_name(service)}"
        )
        self.port = free_port()
        self.target: tuple[str, int] | None = None
        self.routed: Counter[tuple[str, int]] = Counter()
        """Connections sent to each backend (pod IP, port)."""
        self.refused = 0
        """Connections closed at once: no backend, or the backend refused."""
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """The agents' stream URL through the route."""
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    async def _follow(self) -> None:
        while True:
            try:
                self.target = backend(await request(self._api, "GET", self._path, timeout_s=2))
            except NotFoundError:
                self.target = None
            except KubeError:
                pass  # as kube-proxy, keep the last endpoint while the API server fails
            await asyncio.sleep(POLL_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target
        try:
            if target is None:
                raise ConnectionRefusedError("the Service has no endpoint")
            up_reader, up_writer = await asyncio.open_connection(self._pods[target[0]], target[1])
        except OSError:
            self.refused += 1
            writer.close()
            return
        self.routed[target] += 1
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open.difference_update((writer, up_writer))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LeaderRoute]:
        follow = asyncio.create_task(self._follow(), name="leader-route-follow")
        server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        try:
            yield self
        finally:
            server.close()
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
            for writer in list(self._open):
                writer.close()
            await server.wait_closed()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until ``src`` ends or either side fails, then close ``dst`` (the other
    direction's copy then ends too)."""
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()
