"""Fleet-wide reads past one process, against the real API server: three replicas, each
holding one shard's nodes and serving its own HTTP application on 127.0.0.1, each shard's
owner published in its per-shard EndpointSlice (``<service>-shard-<i>-leader``, written by
the real ``LeaderEndpoint``) and found there by the asking replica's ``ShardPeers``. Through
one replica: the merged overview is the whole fleet, the status command pages the whole
fleet across the three shards, the scheduler extender scores the other shards' nodes from
their owners, every request over TLS (the owners' one certificate verified with the CA for
the Service's name, though reached by pod IP) and authorized by the real authorizer
(TokenReview, then SubjectAccessReview for ``get fleet.gpuhealth.io``: the asking replica's
ServiceAccount token must be granted that read); with one owner's server stopped, then its
slice withdrawn, that shard is named ``unavailable`` (with why) in every merged answer, never
silently left out, and so are the shards whose owners refuse the token.

The API server refuses a loopback address in an EndpointSlice, so the replicas publish pod
IPs of their own and the test's peers reach them through the loopback address they listen
on, as the pod network would (the same stand-in as tests/integration/leader_route.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.fleet.view import natural_key
from gpuhealth.controller.http.access import FLEET_RESOURCE
from gpuhealth.controller.http.access_review import SubjectAccessReviewer
from gpuhealth.controller.http.auth import HttpAuthMetrics, HttpAuthorizer
from gpuhealth.controller.http.certificates import issue_ca, issue_serving
from gpuhealth.controller.http.settings import HttpAuthSettings
from gpuhealth.controller.http.tls import server_ssl_context
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.leadership.endpoint import LeaderEndpoint
from gpuhealth.controller.names import API_GROUP
from gpuhealth.controller.placement import ExtenderHandlers, ExtenderSettings, PlacementIndex
from gpuhealth.controller.placement.http import ShardedPlacement, extender_routes, scores_routes
from gpuhealth.controller.placement.peer_scores import PeerScores
from gpuhealth.controller.shards.leases import shard_service_name
from gpuhealth.controller.shards.peers import ShardPeers
from gpuhealth.controller.shards.settings import ShardSettings
from gpuhealth.controller.status_cli import EXIT_INCOMPLETE, exit_code, fetch_fleet, render_table
from gpuhealth.controller.status_page.page import OVERVIEW_PATH
from gpuhealth.controller.stream.token_review import TokenReviewAuthenticator
from gpuhealth.protocol import HealthState
from localkube.objects import create_namespace
from localkube.process import free_port
from tests.integration.chart_identity import service_account_token
from tests.support.shard_replicas import KEYS, Replica, merged_reads, node_names, replica

pytestmark = pytest.mark.integration

SERVICE = "ctl"
SHARDS = ShardSettings(count=3, replicas=3, peer_address_ttl_s=0.2, peer_request_timeout_s=3.0)
NAMES = node_names(30, 3)
STATES: dict[str, HealthState] = {"gpu-node-4": "unhealthy", "gpu-node-17": "degraded"}
POD_IPS = ("10.244.1.2", "10.244.1.3", "10.244.1.4")
EXTENDER = ExtenderSettings(peer_summary_max_age_s=5.0, peer_summary_refresh_s=1.0)


class PodNetworkPeers(ShardPeers):
    """The real peers, reaching a published pod IP on the loopback address (no pod network
    on 127.0.0.1)."""

    def url(self, address: str, path: str) -> str:
        host, _, port = address.rpartition(":")
        assert host in POD_IPS, address
        return super().url(f"127.0.0.1:{port}", path)


@dataclass
class Tokens:
    """The ServiceAccount tokens the test uses: the controllers' own (granted the fleet read,
    as the chart must), and a stranger's (not granted)."""

    controller: str
    stranger: str
    peers_send: str = ""


async def _identities(api: Any, ns: str) -> Tokens:
    for name in ("ctl", "stranger"):
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        await request(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=body)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "fleet-reader"},
        "rules": [{"apiGroups": [API_GROUP], "resources": [FLEET_RESOURCE], "verbs": ["get"]}],
    }
    await request(api, "POST", f"{rbac}/roles", body=role)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "ctl-reads-fleet"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "fleet-reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": ns}],
    }
    await request(api, "POST", f"{rbac}/rolebindings", body=binding)
    ctl = await service_account_token(api, ns, "ctl")
    return Tokens(ctl, await service_account_token(api, ns, "stranger"), peers_send=ctl)


def authorizer(api: Any, ns: str) -> HttpAuthorizer:
    """The controller's own authorizer, reads authorized (the chart's default)."""
    settings = HttpAuthSettings(reads="authorized", cache_ttl_s=0.0)
    return HttpAuthorizer(
        settings,
        TokenReviewAuthenticator(api, settings.audiences),
        SubjectAccessReviewer(api),
        namespace=ns,
        clock=SystemClock(),
        metrics=HttpAuthMetrics(CollectorRegistry()),
    )


@dataclass
class Served:
    replica: Replica
    runner: web.AppRunner
    port: int
    endpoint: LeaderEndpoint
    peers: PodNetworkPeers
    scores: PeerScores

    ca_file: str
    tokens: Tokens

    @property
    def url(self) -> str:
        """Where the operator's command reaches it (a port-forward: ``localhost`` is one of
        the certificate's names)."""
        return f"https://localhost:{self.port}"


async def _service(api: Any, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
    }
    await request(api, "POST", f"/api/v1/namespaces/{namespace}/services", body=body)


def certificate(tmp: Path, names: list[str]) -> tuple[str, str, str]:
    """The replicas' one serving certificate (as the kept Secret gives every replica) and its
    CA: (cert file, key file, CA file)."""
    now = datetime.now(UTC)
    ca = issue_ca("gpuhealth test CA", now, 1)
    pair = issue_serving(ca, names, now, 1)
    files = []
    for name, pem in (("tls.crt", pair.cert), ("tls.key", pair.key), ("ca.crt", ca.cert)):
        (tmp / name).write_bytes(pem)
        files.append(str(tmp / name))
    return files[0], files[1], files[2]


@pytest.fixture
async def owners(
    api_client: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> AsyncIterator[list[Served]]:
    ns = unique_name("shard-reads")
    await create_namespace(api_client, ns)
    service_name = f"{SERVICE}.{ns}.svc"
    cert_file, key_file, ca_file = certificate(tmp_path, [service_name, "localhost"])
    tokens = await _identities(api_client, ns)
    served: list[Served] = []
    try:
        for shard in range(SHARDS.count):
            await _service(api_client, ns, shard_service_name(SERVICE, shard))
            r = replica({shard}, NAMES, STATES)
            peers = PodNetworkPeers(
                api_client,
                SHARDS,
                namespace=ns,
                service=SERVICE,
                clock=SystemClock(),
                token=lambda: tokens.peers_send,
                tls=ssl.create_default_context(cafile=ca_file),
                server_hostname=service_name,
            )
            r.reads = merged_reads(r, peers)
            scores = PeerScores(peers, r.own, EXTENDER, clock=SystemClock())
            index = PlacementIndex(r.fleet, EXTENDER)
            handlers = ExtenderHandlers(
                lambda index=index: index.summaries,  # type: ignore[misc]
                EXTENDER,
                shards=ShardedPlacement(owned=r.own, owns=KEYS.owns, peers=scores),
            )
            app = r.app(front=[authorizer(api_client, ns).middleware])
            app.add_routes([*extender_routes(handlers), *scores_routes(handlers)])
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            tls = server_ssl_context(cert_file, key_file)
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
            endpoint = LeaderEndpoint(
                api_client,
                namespace=ns,
                service=shard_service_name(SERVICE, shard),
                pod_name=f"ctl-{shard}",
                pod_ip=POD_IPS[shard],
                port=port,
            )
            await endpoint.publish()
            served.append(Served(r, runner, port, endpoint, peers, scores, ca_file, tokens))
        yield served
    finally:
        for s in served:
            await s.peers.close()
            await s.runner.cleanup()


async def status(asking: Served) -> dict[str, Any]:
    """What ``gpuhealth-controller status`` reads through ``asking`` (4 nodes a page), with
    the viewer's token (here the controllers' own, which is granted the read)."""
    return await asyncio.to_thread(
        fetch_fleet,
        asking.url,
        ca_file=asking.ca_file,
        page_limit=4,
        token=asking.tokens.controller,
    )


def shard_order(shards: tuple[int, ...] = (0, 1, 2)) -> list[str]:
    return [n for i in shards for n in sorted(NAMES[i], key=natural_key)]


async def test_any_replica_reads_the_whole_fleet_and_names_a_shard_it_cannot_read(
    owners: list[Served],
) -> None:
    asking = owners[0]
    assert asking.replica.reads is not None

    overview = await asking.replica.reads.overview([])
    assert overview["shards"] == {"count": 3, "read": [0, 1, 2], "unavailable": []}
    assert overview["summary"]["nodes"] == 30 and overview["summary"]["tainted_nodes"] == 1
    assert overview["summary"]["nodes_by_state"] == {
        "healthy": 28,
        "degraded": 1,
        "unknown": 0,
        "unhealthy": 1,
    }
    assert [n["name"] for n in overview["nodes"]] == sorted(shard_order(), key=natural_key)

    fleet = await asyncio.to_thread(
        fetch_fleet,
        asking.url,
        ca_file=asking.ca_file,
        page_limit=4,
        token=asking.tokens.controller,
    )
    assert [n["name"] for n in fleet["nodes"]] == shard_order()
    assert fleet["shards"]["unavailable"] == []

    await asking.scores.refresh()
    remote = {n: 0 for n in NAMES[1] + NAMES[2]}
    assert asking.scores.scores().keys() == remote.keys()

    # Shard 2's owner stops answering (its slice still names it).
    await owners[2].runner.cleanup()
    overview = await asking.replica.reads.overview([])
    (missing,) = overview["shards"]["unavailable"]
    assert missing["shard"] == 2 and "did not answer" in missing["reason"]
    assert overview["summary"]["nodes"] == 30 - len(NAMES[2])
    fleet = await asyncio.to_thread(
        fetch_fleet,
        asking.url,
        ca_file=asking.ca_file,
        page_limit=4,
        token=asking.tokens.controller,
    )
    assert [n["name"] for n in fleet["nodes"]] == shard_order((0, 1))
    assert [u["shard"] for u in fleet["shards"]["unavailable"]] == [2]
    assert "INCOMPLETE: shard 2 not read" in render_table(fleet)
    assert exit_code({**fleet, "nodes": []}) == EXIT_INCOMPLETE

    # Shard 1's owner withdraws its slice (it lost the shard, nobody took it yet).
    await owners[1].endpoint.withdraw()
    await asyncio.sleep(SHARDS.peer_address_ttl_s)
    overview = await asking.replica.reads.overview([("state", "unhealthy")])
    reasons = {u["shard"]: u["reason"] for u in overview["shards"]["unavailable"]}
    assert reasons.keys() == {1, 2}
    assert reasons[1] == "no owner published (its Lease is not held)"
    fleet = await asyncio.to_thread(
        fetch_fleet,
        asking.url,
        ca_file=asking.ca_file,
        page_limit=4,
        token=asking.tokens.controller,
    )
    assert [n["name"] for n in fleet["nodes"]] == shard_order((0,))


async def test_the_merged_routes_answer_over_http_with_scope_local_for_peers(
    owners: list[Served],
) -> None:
    tls = ssl.create_default_context(cafile=owners[1].ca_file)
    bearer = {"Authorization": f"Bearer {owners[1].tokens.controller}"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls), headers=bearer
    ) as client:
        base = owners[1].url
        async with client.get(f"{base}{OVERVIEW_PATH}", params={"scope": "local"}) as r:
            local = await r.json()
        async with client.get(f"{base}{OVERVIEW_PATH}") as r:
            merged = await r.json()
        async with client.get(f"{base}/api/v1/fleet", params={"continue": "x"}) as r:
            assert r.status == 400
            assert "continue: not a token this API issued" in (await r.json())["error"]
        async with client.get(f"{base}{OVERVIEW_PATH}", headers={"Authorization": ""}) as r:
            assert r.status == 401  # the merged routes sit behind the authorizer
    assert local["shards"] == [1] and local["summary"]["nodes"] == len(NAMES[1])
    assert merged["summary"]["nodes"] == 30


async def test_owners_refusing_the_asking_replicas_token_are_named(owners: list[Served]) -> None:
    """A replica whose ServiceAccount may not read the fleet (the chart without the grant)
    gets its peers' 403: those shards are unavailable, with the answer, never left out."""
    asking = owners[2]
    assert asking.replica.reads is not None
    asking.tokens.peers_send = asking.tokens.stranger
    overview = await asking.replica.reads.overview([])
    reasons = {u["shard"]: u["reason"] for u in overview["shards"]["unavailable"]}
    assert reasons.keys() == {0, 1}
    assert all("answered HTTP 403" in why for why in reasons.values()), reasons
    assert overview["summary"]["nodes"] == len(NAMES[2])
