"""A Service-like route to the controller's leader, or to each shard's owner, for tests that
run the replicas as processes on 127.0.0.1 (no kube-proxy there).

The chart's controller Service has no selector: the leader keeps its one EndpointSlice,
``<service>-leader``, pointing at its own pod IP and port
(:mod:`gpuhealth.controller.leadership.endpoint`). Past one process (``shards.count`` S > 1)
each shard has a Service of its own, ``<service>-shard-<i>``
(:func:`gpuhealth.controller.shards.leases.shard_service_name`), and shard ``i``'s owner
keeps that Service's slice, ``<service>-shard-<i>-leader``, the same way. With S = 1 the
one shard's route is the leader's (the controller is exactly today's).

:class:`ShardEndpoints` follows those S slices on the real API server (one LIST every
``POLL_S``) and knows, for each shard, the address its Service sends a new connection to: what
kube-proxy knows on every node. :class:`LeaderRoute` does for a test what kube-proxy does
for those Services: one local TCP listener per shard, one port on a loopback address of each
shard's own (``127.<shard>.250.1``: :data:`URL_TEMPLATE`, :meth:`LeaderRoute.url_of`), each
sending every new connection to the address its shard's slice names *when the connection
arrives*, through ``pods``: the API server refuses a loopback address in an EndpointSlice, so
the replicas publish pod IPs of their own and the route maps each to the loopback address that
replica listens on (the pod network, on 127.0.0.0/8); a connection already open stays with
its backend until one side closes it (a killed owner's kernel closes it). While a slice is
empty or missing a connection to that shard is closed at once (refused), as a Service without
endpoints is. Each backend's connections are counted (:attr:`LeaderRoute.routed`, and per
shard :attr:`LeaderRoute.routed_to_shard`), so a test sees that the agents reached the
successor through the route.

Agents choose their shard's URL themselves (``shard_of(node, S)``, then the shard a 503 names
in ``Gpuhealth-Shard``): :attr:`LeaderRoute.url_template` is a ``controller_url`` with
``{shard}`` as the chart renders it for the agents, :meth:`LeaderRoute.url_of` one shard's.
Processes that follow the slices themselves (the bench's agents' processes, each the
kube-proxy of its nodes) use :class:`ShardEndpoints` alone and connect straight to
:meth:`ShardEndpoints.address`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.leadership.endpoint import SERVICE_NAME_LABEL, slice_name
from gpuhealth.controller.shards.leases import shard_service_name
from localkube.process import free_port

URL_TEMPLATE = "ws://127.{shard}.250.1:{port}/v1/stream"
"""Where shard ``shard``'s listener is: an address of its own, one port for all (so that one
``{shard}`` template names every shard's, as the chart's per-shard Service names do)."""
POLL_S = 0.05
"""How often the route reads the slices (kube-proxy follows a watch; a LIST every 50 ms on
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


def shard_service(service: str, shard: int, shards: int) -> str:
    """The Service agents of ``shard`` reach its owner through: the leader's with one shard
    (exactly today's controller), ``<service>-shard-<i>`` past one (pure)."""
    return service if shards == 1 else shard_service_name(service, shard)


def targets(
    slices: list[dict[str, Any]], service: str, shards: int
) -> list[tuple[str, int] | None]:
    """Each shard's backend among the listed ``slices`` (None: its slice missing or empty;
    other slices ignored) (pure)."""
    by_name = {s.get("metadata", {}).get("name"): s for s in slices}
    out: list[tuple[str, int] | None] = []
    for i in range(shards):
        found = by_name.get(slice_name(shard_service(service, i, shards)))
        out.append(backend(found) if found is not None else None)
    return out


class ShardEndpoints:
    """Where each shard's Service sends a new connection now, following the slices."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        service: str,
        pods: Mapping[str, str],
        shards: int = 1,
        *,
        poll_s: float = POLL_S,
    ) -> None:
        self._api = api
        self.service = service
        self.shards = shards
        self.pods = dict(pods)
        self.poll_s = poll_s
        self.targets: list[tuple[str, int] | None] = [None] * shards
        """Each shard's backend (pod IP, port) as last read; None while it has none."""
        names = ",".join(shard_service(service, i, shards) for i in range(shards))
        self._path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        self._query = [("labelSelector", f"{SERVICE_NAME_LABEL} in ({names})")]
        self.read = asyncio.Event()
        """Set once the slices were read (a shard without a backend is then known to have
        none)."""

    def address(self, shard: int) -> tuple[str, int] | None:
        """Where a connection for ``shard`` goes now: the loopback address of the pod its
        slice names, and the port; None while it names none (or a pod not in ``pods``)."""
        target = self.targets[shard]
        if target is None or target[0] not in self.pods:
            return None
        return self.pods[target[0]], target[1]

    async def refresh(self) -> None:
        """One LIST of the slices; every shard's target from it."""
        listed = await request(self._api, "GET", self._path, query=self._query, timeout_s=2)
        self.targets = targets(listed.get("items") or [], self.service, self.shards)
        self.read.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(KubeError, TimeoutError):
                # as kube-proxy, keep the last endpoints while the API server fails
                await self.refresh()
            await asyncio.sleep(self.poll_s)

    @asynccontextmanager
    async def following(self) -> AsyncIterator[ShardEndpoints]:
        """The slices followed (read once before this yields) until the block ends."""
        task = asyncio.create_task(self.run(), name="shard-endpoints-follow")
        try:
            await asyncio.wait_for(self.read.wait(), 10)
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class LeaderRoute:
    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        service: str,
        pods: Mapping[str, str],
        shards: int = 1,
    ) -> None:
        self.endpoints = ShardEndpoints(api, namespace, service, pods, shards)
        self.port = free_port()
        """Every shard's listener's port (each on its own address: :meth:`host`)."""
        self.routed: Counter[tuple[str, int]] = Counter()
        """Connections sent to each backend (pod IP, port)."""
        self.routed_to_shard: Counter[int] = Counter()
        """Connections sent on, per shard."""
        self.refused = 0
        """Connections closed at once: no backend, or the backend refused."""
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def target(self) -> tuple[str, int] | None:
        """The leader's backend (shard 0's) now."""
        return self.endpoints.targets[0]

    @property
    def url(self) -> str:
        """The agents' stream URL through the leader's route (shard 0's)."""
        return self.url_of(0)

    @property
    def url_template(self) -> str:
        """The agents' ``controller_url``: their shard's listener with ``{shard}`` in it."""
        return URL_TEMPLATE.replace("{port}", str(self.port))

    def url_of(self, shard: int) -> str:
        """The stream URL of ``shard``'s agents through the route."""
        return self.url_template.format(shard=shard)

    @staticmethod
    def host(shard: int) -> str:
        """The loopback address ``shard``'s listener is on."""
        return f"127.{shard}.250.1"

    async def _accept(
        self, shard: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = self.endpoints.targets[shard]
        try:
            if target is None:
                raise ConnectionRefusedError("the Service has no endpoint")
            up_reader, up_writer = await asyncio.open_connection(
                self.endpoints.pods[target[0]], target[1]
            )
        except OSError:
            self.refused += 1
            writer.close()
            return
        self.routed[target] += 1
        self.routed_to_shard[shard] += 1
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open.difference_update((writer, up_writer))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LeaderRoute]:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.endpoints.following())
            servers = []
            for shard in range(self.endpoints.shards):

                async def accept(
                    r: asyncio.StreamReader, w: asyncio.StreamWriter, shard: int = shard
                ) -> None:
                    await self._accept(shard, r, w)

                servers.append(await asyncio.start_server(accept, self.host(shard), self.port))
            try:
                yield self
            finally:
                for server in servers:
                    server.close()
                for writer in list(self._open):
                    writer.close()
                for server in servers:
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
