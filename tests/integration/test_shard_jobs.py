"""Past one process, a job whose pods run on nodes of two shards is decided once, by its home
shard's owner, against the real API server: two controllers built as production builds them
(``build_controller``, ``shards.count: 2``, the chart's identity and RBAC), each owning one
shard through its Lease, each serving its HTTP application on 127.0.0.1 and publishing its
shard's EndpointSlice (``LeaderEndpoint``, a pod IP of its own: the API server refuses a
loopback address, and the peers reach the published pod IP on the loopback address, as the
pod network would; the same stand-in as test_shard_reads.py). The replicas hand each other
the job's reports and attempts with their ServiceAccount's own token, which the receiver
authorizes (TokenReview, then ``create shardreports.gpuhealth.io``: the chart's grant).

A 4-node Job (two nodes in each shard) crash-loops: each attempt the same GPU, on a node of
the shard that is *not* the job's home, faults first (XID 31), then every rank aborts (XID
43). The agents' messages go straight into each node's owner's judge (as in
test_shards.py). Then:

- exactly one job incident: one GPUIncident object, naming all four nodes, opened by the home
  owner alone (the other owner's book has no job incident);
- no write ping-pong: over full flush intervals every version of the object names every
  node, and it is written at most once an interval (its ``lastSeen``);
- after ``blame_attempts`` attempts the first-faulting GPU is blamed by its node's owner, the
  non-home replica, from the attempts the home owner sent it;
- a ServiceAccount without the chart's grant is refused (403) at both routes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from datetime import UTC, datetime
from functools import partial
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.assembly import Incidents
from gpuhealth.controller.incidents.handoff import ATTEMPTS_PATH, REPORTS_PATH
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.incidents.model import incident_id
from gpuhealth.controller.incidents.overlay import BLAME_CODE
from gpuhealth.controller.kube.rest import ConflictError, NotFoundError, request
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards import peers as peers_module
from gpuhealth.controller.shards.leases import shard_service_name
from gpuhealth.controller.shards.peers import ShardPeers
from gpuhealth.protocol import Event
from gpuhealth.protocol.shards import shard_of
from localkube import ControlPlane
from localkube.objects import pod_body
from localkube.process import free_port
from tests.integration.chart_identity import service_account_token
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.protocol import allocation, gpu_uuid, hello, next_seq, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

COUNT = 2
LABEL = Keys().shard_label
POD_IP = "10.244.7.2"
"""Both replicas' pod IP (each on its own port): what the peers map to 127.0.0.1."""
PERSIST_S = 2.0
ATTEMPT_GAP_S = 1.5
BLAME_ATTEMPTS = 3


def settings(service: str, port: int) -> dict[str, Any]:
    return {
        "listen": f"127.0.0.1:{port}",
        "leader": {
            "enabled": True,
            "service": service,
            "lease_duration_s": 3,
            "renew_deadline_s": 2.0,
            "retry_period_s": 1.0,
        },
        # Each replica takes its fair share (one shard) and never the other's.
        "shards": {
            "count": COUNT,
            "replicas": 2,
            "takeover_after_s": 600.0,
            "peer_address_ttl_s": 0.5,
            "handoff_backoff_s": 0.2,
            "handoff_backoff_max_s": 1.0,
        },
        "incidents": {
            "persist_interval_s": PERSIST_S,
            "judge": {
                "attempt_gap_s": ATTEMPT_GAP_S,
                "first_fault_margin_s": 0.2,
                "burst_s": 0.1,
                "tick_s": 0.5,
                "suspect_attempts": 2,
                "blame_attempts": BLAME_ATTEMPTS,
            },
        },
    }


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def incidents(ctl: Controller) -> Incidents:
    assert ctl.parts.incidents is not None
    return ctl.parts.incidents


def owned(ctl: Controller) -> frozenset[int]:
    assert ctl.parts.shards is not None
    return ctl.parts.shards.leases.owned()


async def _service(kube: Cluster, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
    }
    with suppress(ConflictError):
        await request(kube.api, "POST", f"/api/v1/namespaces/{namespace}/services", body=body)


def xid(node: str, code: int) -> Event:
    return Event(
        seq=next_seq(),
        node=node,
        at=datetime.now(UTC),
        kind="xid",
        gpu_uuid=gpu_uuid(0, node),
        gpu_index=0,
        previous="healthy",
        current="healthy",
        xid=code,
    )


async def test_a_job_across_two_shards_is_decided_once_by_its_home(
    kube: Cluster, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.chart_values = {"shards": {"count": COUNT}, "controller": {"replicas": 2}}
    release = await kube.release()
    service = release.controller_fullname
    for name in (service, *(shard_service_name(service, i) for i in range(COUNT))):
        await _service(kube, release.namespace, name)
    # The pod network and the kubelet's token mount, for replicas on 127.0.0.1.
    monkeypatch.setenv("POD_IP", POD_IP)

    def pod_network(_self: ShardPeers, address: str, path: str) -> str:
        host, _, port = address.rpartition(":")
        assert host == POD_IP, address
        return f"http://127.0.0.1:{port}{path}"

    monkeypatch.setattr(ShardPeers, "url", pod_network)
    token = await service_account_token(
        kube.api, release.namespace, release.controller_service_account
    )
    monkeypatch.setattr(peers_module, "service_account_token", lambda *_a: lambda: token)

    # The job: four pods of Job ``train`` in a namespace of its own, two nodes in each shard.
    ns = unique_name("ml")
    await kube.namespace(ns)
    with suppress(ConflictError):
        await request(
            kube.api,
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
        )
    job = f"{ns}/Job/train"
    home = shard_of(job, COUNT)
    base = unique_name("sj")
    by_shard: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in by_shard.values()) < 2:
        name = f"{base}-{i}"
        i += 1
        if len(by_shard[shard_of(name, COUNT)]) < 2:
            by_shard[shard_of(name, COUNT)].append(name)
    nodes = sorted(by_shard[0] + by_shard[1])
    for n in nodes:
        await kube.node(n, gpus=1, labels={LABEL: str(shard_of(n, COUNT))})
    first = by_shard[1 - home][0]  # the GPU first to fault: on the shard that is not home
    pods = {n: f"train-{k}" for k, n in enumerate(nodes)}
    for n, pod in pods.items():
        body = pod_body(pod, node_name=n)
        body["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "train"}
        await request(kube.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=body)

    ports = [free_port(), free_port()]
    runners: list[web.AppRunner] = []
    try:
        a = await kube.controller(settings(service, ports[0]), identity="replica-a")
        await until(lambda: len(owned(a)) == 1, "replica a owns one shard")
        b = await kube.controller(settings(service, ports[1]), identity="replica-b")
        await until(lambda: len(owned(b)) == 1, "replica b owns the other")
        for ctl, port in ((a, ports[0]), (b, ports[1])):
            runner = web.AppRunner(ctl.web_app())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            await until(
                lambda ctl=ctl: ctl.parts.shards is not None and ctl.parts.shards.ready,  # type: ignore[misc]
                "owner ready",
            )
        owner_of = {n: a if shard_of(n, COUNT) in owned(a) else b for n in nodes}
        home_ctl = a if home in owned(a) else b
        other_ctl = b if home_ctl is a else a
        for n in nodes:
            await until(
                lambda n=n: owner_of[n].parts.cache.get(n) is not None,  # type: ignore[misc]
                f"{n} in its owner's cache",
            )
        for n in nodes:  # each agent reports to its node's owner: its pod holds GPU 0
            sink = owner_of[n].parts.stream.sink
            sink.on_connect(n, hello(n, 1))
            alloc = allocation(gpu_uuid(0, n), pods[n], namespace=ns)
            sink.on_message(n, snapshot(n, 1, allocations=[alloc]))

        name = incident_id("job", job)
        blamed_key = (first, gpu_uuid(0, first))
        for attempt in range(BLAME_ATTEMPTS):
            owner_of[first].parts.stream.sink.on_message(first, xid(first, 31))
            await asyncio.sleep(0.4)  # past first_fault_margin_s: this GPU was first
            for n in nodes:
                owner_of[n].parts.stream.sink.on_message(n, xid(n, 43))
            if attempt == 0:

                async def opened() -> dict[str, Any] | None:
                    with suppress(NotFoundError):
                        got: dict[str, Any] = await request(kube.api, "GET", f"{INCIDENTS}/{name}")
                        if got.get("status", {}).get("subjects", {}).get("nodes") == nodes:
                            return got
                    return None

                obj: dict[str, Any] = await until(opened, "one job incident naming every node")
                assert obj["status"]["key"] == job and obj["status"]["state"] == "open"
            await asyncio.sleep(ATTEMPT_GAP_S + 0.6)  # the next attempt

        # The first-faulting GPU, on the non-home shard, blamed by its own node's owner.
        await until(
            lambda: (
                (c := incidents(other_ctl).judge.blamed().get(blamed_key)) is not None
                and c.code == BLAME_CODE
            ),
            "the first-faulting GPU blamed by its node's owner",
        )
        gpu_incident = incidents(other_ctl).book.find("gpu", f"{first}/{blamed_key[1]}")
        assert gpu_incident is not None
        assert f"the first to fault in {BLAME_ATTEMPTS} attempts of {job}" in gpu_incident.reason
        tainted: bool = await until(
            partial(_tainted, kube, first), f"{first} tainted by its owner", timeout_s=20
        )
        assert tainted

        # Decided once: the home's book has the job incident, the other's has none.
        assert [i.key for i in incidents(home_ctl).book.list(kind="job")] == [job]
        assert incidents(other_ctl).book.list(kind="job") == []
        assert incidents(home_ctl).judge.blamed() == {}
        # One object, and no write ping-pong: over three full flush intervals (the job still
        # in its window: its lastSeen moves, written once an interval) every version of it
        # names every node, and it is written at most once an interval (two writers with
        # partial views would each rewrite it at every flush, alternating its nodes).
        seen: dict[str, list[str]] = {}
        loop = asyncio.get_running_loop()
        watch_until = loop.time() + 3 * PERSIST_S
        while loop.time() < watch_until:
            got = await request(kube.api, "GET", f"{INCIDENTS}/{name}")
            seen[got["metadata"]["resourceVersion"]] = got["status"]["subjects"]["nodes"]
            await asyncio.sleep(0.1)
        assert all(v == nodes for v in seen.values()), seen
        assert len(seen) <= 3 + 1, seen
        after = await request(kube.api, "GET", f"{INCIDENTS}/{name}")
        assert f"#{BLAME_ATTEMPTS} {first}/{blamed_key[1]} XID 31" in after["status"]["reason"]
        # The routes are the replicas' own: a token without the chart's grant is refused.
        stranger = "stranger"  # the release namespace is this test's own
        await request(
            kube.api,
            "POST",
            f"/api/v1/namespaces/{release.namespace}/serviceaccounts",
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": stranger}},
        )
        refused = await service_account_token(kube.api, release.namespace, stranger)
        async with aiohttp.ClientSession() as http:
            for path, bearer, status in (
                (REPORTS_PATH, refused, 403),
                (ATTEMPTS_PATH, refused, 403),
                (REPORTS_PATH, token, 400),  # allowed, and the body is not one
            ):
                async with http.post(
                    f"http://127.0.0.1:{ports[0]}{path}",
                    data=b"{}",
                    headers={"Authorization": f"Bearer {bearer}"},
                ) as resp:
                    assert resp.status == status, (path, await resp.text())
        listed = await request(kube.api, "GET", INCIDENTS)
        assert [o["metadata"]["name"] for o in listed["items"] if o["status"]["key"] == job] == [
            name
        ]
    finally:
        for runner in runners:
            await runner.cleanup()
        with suppress(NotFoundError):
            await request(kube.api, "DELETE", f"/api/v1/namespaces/{ns}")


async def _tainted(kube: Cluster, node: str) -> bool | None:
    return True if our_taints(await get_node(kube.api, node)) else None
