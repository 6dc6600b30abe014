"""The other shards' owners, found through the API server and asked over HTTP.

Past one process (``shards.count`` > 1) a replica holds only its own shards' nodes; a reader
of the whole fleet asks every other shard's owner for its local view. Shard ``i``'s owner
publishes its pod IP as the only endpoint of the EndpointSlice
``<leader.service>-shard-<i>-leader``
(:func:`gpuhealth.controller.leadership.endpoint.slice_name` of
:func:`gpuhealth.controller.shards.leases.shard_service_name`), exactly as the leader does for
the leader's Service. :class:`ShardPeers` reads that slice (kept ``shards.peer_address_ttl_s``,
read again at once after the owner did not answer) and sends the owner a GET with
``scope=local``, the controller's own ServiceAccount token as the bearer (the owner
authorizes it as any reader) and, with TLS, the controller's CA and the name its certificate
carries. Every failure is an answer too: :class:`ShardAnswer` with no body and the reason
(no owner published, refused, timed out, an HTTP error, not JSON), never an exception, so
that a merged read names the shard it could not read instead of answering a part as the
whole. Shards this replica owns are not asked here: the readers answer them locally.
:meth:`ShardPeers.post` sends a body the same way (the job incidents' handoffs between
owners, :mod:`gpuhealth.controller.incidents.handoff`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.leadership.endpoint import slice_name
from gpuhealth.controller.shards.leases import shard_service_name
from gpuhealth.controller.shards.settings import ShardSettings

log = get_logger("shards.peers")

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
"""Where the kubelet mounts (and rotates) the pod's ServiceAccount token."""
LOCAL_SCOPE = ("scope", "local")
"""The query parameter that makes a replica answer for its own shards only."""


def service_account_token(path: str = SERVICE_ACCOUNT_TOKEN) -> Callable[[], str | None]:
    """The token read at each request (the kubelet rotates the file); None without it."""

    def read() -> str | None:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None

    return read


@dataclass(frozen=True, slots=True)
class ShardAnswer:
    """One owner's answer for the shards it was asked about: its JSON document, or why there
    is none."""

    shards: tuple[int, ...]
    """The shards asked of this owner (its document says which it holds: ``shards``)."""
    body: dict[str, Any] | None
    reason: str = ""
    """Why the shards could not be read (``body`` None)."""

    @property
    def available(self) -> bool:
        return self.body is not None


def owner_address(endpoint_slice: Mapping[str, Any], port_name: str) -> str | None:
    """``host:port`` of the slice's ready endpoint (``[v6]:port`` for IPv6), None when the
    slice names none (withdrawn: the owner stopped) or has no port ``port_name``; pure."""
    ports = [
        p.get("port")
        for p in endpoint_slice.get("ports") or []
        if isinstance(p, Mapping) and p.get("name") == port_name
    ]
    if not ports or not isinstance(ports[0], int):
        return None
    for endpoint in endpoint_slice.get("endpoints") or []:
        if not isinstance(endpoint, Mapping):
            continue
        conditions = endpoint.get("conditions") or {}
        if isinstance(conditions, Mapping) and conditions.get("ready") is False:
            continue
        for address in endpoint.get("addresses") or []:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                continue
            host = f"[{ip}]" if ip.version == 6 else str(ip)
            return f"{host}:{ports[0]}"
    return None


@dataclass(slots=True)
class _Known:
    address: str | None
    read_at: float


class ShardPeers:
    """Finds shard ``i``'s owner and asks it; :meth:`ask` never raises."""

    def __init__(
        self,
        api: ApiClient,
        settings: ShardSettings,
        *,
        namespace: str,
        service: str,
        clock: Clock,
        token: Callable[[], str | None] | None = None,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        port_name: str = "http",
        api_timeout_s: float = 10.0,
    ) -> None:
        """``service``: ``leader.service``; ``tls``: the context that verifies the owners'
        certificate (the controller's CA; None: plain HTTP), ``server_hostname`` the name it
        is verified for (one of ``tls.names``: every replica serves the same certificate);
        ``port_name``: the port of the per-shard EndpointSlice; ``api_timeout_s``: the
        deadline of the EndpointSlice read (``leader.request_timeout_s``)."""
        self.settings = settings
        self.namespace = namespace
        self.service = service
        self._api = api
        self._clock = clock
        self._token = token or service_account_token()
        self._tls = tls
        self._server_hostname = server_hostname if tls is not None else None
        self._port_name = port_name
        self._api_timeout_s = api_timeout_s
        self._known: dict[int, _Known] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def count(self) -> int:
        return self.settings.count

    def slice_path(self, shard: int) -> str:
        name = slice_name(shard_service_name(self.service, shard))
        return (
            f"/apis/discovery.k8s.io/v1/namespaces/{quote(self.namespace)}"
            f"/endpointslices/{quote(name)}"
        )

    async def address(self, shard: int) -> str | None:
        """Shard ``shard``'s owner as ``host:port`` (None: none published), read at most
        every ``peer_address_ttl_s``. Raises :class:`KubeError` when the slice cannot be
        read."""
        now = self._clock.monotonic()
        known = self._known.get(shard)
        if known is not None and now - known.read_at < self.settings.peer_address_ttl_s:
            return known.address
        try:
            body = await request(
                self._api, "GET", self.slice_path(shard), timeout_s=self._api_timeout_s
            )
        except NotFoundError:
            address = None
        else:
            address = owner_address(body, self._port_name)
        self._known[shard] = _Known(address, now)
        return address

    def forget(self, shard: int) -> None:
        """The owner did not answer: its address is read again next time."""
        self._known.pop(shard, None)

    def url(self, address: str, path: str) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{address}{path}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=self.settings.peer_request_timeout_s,
                sock_connect=self.settings.peer_connect_timeout_s,
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def ask(self, shard: int, path: str, params: Sequence[tuple[str, str]]) -> ShardAnswer:
        """GET ``path`` of shard ``shard``'s owner with ``params`` and ``scope=local``."""
        address, why = await self._address_or_why(shard)
        if address is None:
            return ShardAnswer((shard,), None, why)
        return await self._get((shard,), address, path, params)

    async def ask_owners(
        self, shards: Sequence[int], path: str, params: Sequence[tuple[str, str]]
    ) -> list[ShardAnswer]:
        """GET ``path`` once of each distinct owner of ``shards`` (a replica holding several
        answers for all of them at once), at once; the answers in the order of each owner's
        lowest shard, then the shards without a readable owner."""
        found = await asyncio.gather(*(self._address_or_why(i) for i in shards))
        owners: dict[str, list[int]] = {}
        missing: list[ShardAnswer] = []
        for shard, (address, why) in zip(shards, found, strict=True):
            if address is None:
                missing.append(ShardAnswer((shard,), None, why))
            else:
                owners.setdefault(address, []).append(shard)
        asked = await asyncio.gather(
            *(self._get(tuple(group), address, path, params) for address, group in owners.items())
        )
        return [*asked, *missing]

    async def _address_or_why(self, shard: int) -> tuple[str | None, str]:
        try:
            address = await self.address(shard)
        except (KubeError, TimeoutError, OSError) as exc:
            log.info("shard_owner_unreadable", shard=shard, error=str(exc))
            return None, f"its owner's EndpointSlice cannot be read: {exc}"
        return address, "" if address else "no owner published (its Lease is not held)"

    async def post(self, shard: int, path: str, body: bytes) -> ShardAnswer:
        """POST the JSON ``body`` to ``path`` of shard ``shard``'s owner (a replica-to-replica
        route: the owners' handoffs of job reports and attempts); its JSON answer, or why
        there is none."""
        address, why = await self._address_or_why(shard)
        if address is None:
            return ShardAnswer((shard,), None, why)
        return await self._call("POST", (shard,), address, path, [], payload=body)

    async def _get(
        self, shards: tuple[int, ...], address: str, path: str, params: Sequence[tuple[str, str]]
    ) -> ShardAnswer:
        query = [*(p for p in params if p[0] != LOCAL_SCOPE[0]), LOCAL_SCOPE]
        return await self._call("GET", shards, address, path, query)

    async def _call(
        self,
        method: str,
        shards: tuple[int, ...],
        address: str,
        path: str,
        query: Sequence[tuple[str, str]],
        *,
        payload: bytes | None = None,
    ) -> ShardAnswer:
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        target = self.url(address, path)
        try:
            async with self._client().request(
                method,
                target,
                params=query,
                data=payload,
                headers=headers,
                ssl=self._tls if self._tls is not None else True,
                server_hostname=self._server_hostname,
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            for shard in shards:
                self.forget(shard)
            log.info("shard_owner_unreachable", shards=shards, address=address, error=repr(exc))
            return ShardAnswer(shards, None, f"its owner {address} did not answer: {exc!r}")
        try:
            body = _json(raw)
        except ValueError:
            why = f"its owner {address} answered HTTP {status}, not a JSON object"
            return ShardAnswer(shards, None, why)
        if status != 200:
            message = body.get("message") or body.get("error") or ""
            return ShardAnswer(
                shards, None, f"its owner {address} answered HTTP {status} {message}".rstrip()
            )
        return ShardAnswer(shards, body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _json(raw: bytes) -> dict[str, Any]:
    """The JSON object ``raw`` holds; ValueError for anything else."""
    value = json.loads(raw or b"null")
    if isinstance(value, dict):
        return value
    raise ValueError("not a JSON object")
