"""Past one process, assembled (``shards.count: 3``), against the real API server: two
controllers built as production builds them (``build_controller``), each owning shards through
their Leases.

- The replicas split the shards; each node cache holds exactly its shards' Nodes (selected by
  the shard label), and a fault on a node is tainted by that node's owner.
- The door: an agent of a node another replica owns is turned away with 503 and the shard
  that owns it (``Gpuhealth-Shard``, read from the Node's label: a domain's node goes to its
  domain's shard, not its name's).
- A node relabelled into another shard leaves one cache (left, not deleted: its taint stays)
  and appears in the other's.
- One replica stops cleanly: the other takes its shards over; the taints its predecessor
  wrote stay until the node's agent reports healthy to the new owner (positive evidence),
  then go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpuhealth.controller.app import Controller
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards.leases import shard_lease_name
from gpuhealth.protocol import NODE_HEADER
from gpuhealth.protocol.shards import SHARD_HEADER, shard_of
from localkube import ControlPlane
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import fault
from tests.support.wait import until

pytestmark = pytest.mark.integration

COUNT = 3
LABEL = Keys().shard_label
CLIQUE = "nvidia.com/gpu.clique"


def in_shard(prefix: str, shard: int) -> str:
    """A domain name (``<prefix>-<n>``) whose shard is ``shard``."""
    return next(f"{prefix}-{n}" for n in range(100) if shard_of(f"{prefix}-{n}", COUNT) == shard)


def in_another_shard(prefix: str, shard: int) -> str:
    """A domain name whose shard is not ``shard``."""
    return in_shard(prefix, (shard + 1) % COUNT)


SHARDS: dict[str, Any] = {
    "leader": {
        "enabled": True,
        "lease_duration_s": 3,
        "renew_deadline_s": 2.0,
        "retry_period_s": 1.0,
    },
    "shards": {"count": COUNT, "replicas": 2, "takeover_after_s": 2.0},
    "breaker": {"min_nodes": 30},
}
"""On top of the chart's configuration (its shard count, its Lease's name): short Leases;
a breaker floor each shard's part of which lets its owner taint (past one process
``min_nodes`` is split by the shards' GPU nodes: the default 1 leaves most shards 0)."""


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def owned(ctl: Controller) -> frozenset[int]:
    assert ctl.parts.shards is not None
    return ctl.parts.shards.leases.owned()


def tainted(node: dict[str, Any]) -> bool:
    return any(key.endswith("/unhealthy") for key, _, _ in our_taints(node))


async def test_replicas_split_the_shards_serve_and_write_only_their_nodes(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    base = unique_name("sh")
    nodes = [f"{base}-{i}" for i in range(18)]
    for n in nodes:  # unlabelled: the singleton labels every node
        await kube.node(n)
    # A domain's node (its clique label): the singleton labels it with its domain's shard,
    # not its name's.
    domain_node = f"{base}-dom"
    domain = in_another_shard(f"{base}-clique", shard_of(domain_node, COUNT))
    domain_shard = shard_of(domain, COUNT)
    await kube.node(domain_node, labels={CLIQUE: domain})
    by_shard = {i: {n for n in nodes if shard_of(n, COUNT) == i} for i in range(COUNT)}
    by_shard[domain_shard].add(domain_node)

    kube.chart_values = {"shards": {"count": COUNT}, "controller": {"replicas": 2}}
    cfg = SHARDS
    a = await kube.controller(cfg, identity="replica-a")
    await until(lambda: len(owned(a)) == 2, "replica a owns its fair share, 2 of 3")
    b = await kube.controller(cfg, identity="replica-b")
    await until(lambda: len(owned(b)) == 1, "replica b owns the third")
    assert owned(a) | owned(b) == frozenset(range(COUNT)) and not owned(a) & owned(b)
    for ctl in (a, b):
        want = set().union(*(by_shard[i] for i in owned(ctl)))
        await until(
            lambda ctl=ctl, want=want: want <= set(ctl.parts.cache.names()),  # type: ignore[misc]
            "each cache lists its shards' nodes",
        )
        # of this test's nodes exactly its shards' (the cluster is shared with other tests:
        # the labeller labels their Nodes too), and no Node of another shard at all
        assert set(ctl.parts.cache.names()) & {*nodes, domain_node} == want
        assert all(int(v.labels[LABEL]) in owned(ctl) for v in ctl.parts.cache.views()), (
            "a Node of a shard this replica does not own is cached"
        )
        await until(lambda ctl=ctl: ctl.parts.shards and ctl.parts.shards.ready, "owner ready")  # type: ignore[misc]

    # The door: each replica serves its own nodes, turns the others away to their shard.
    async with TestServer(a.web_app()) as server, aiohttp.ClientSession() as http:
        for n in [*nodes, domain_node]:
            shard = domain_shard if n == domain_node else shard_of(n, COUNT)
            async with http.get(server.make_url("/v1/stream"), headers={NODE_HEADER: n}) as r:
                if shard in owned(a):
                    assert r.status != 503, n  # on to the upgrade (a plain GET: 400)
                else:
                    assert r.status == 503, n
                    assert r.headers.get(SHARD_HEADER) == str(shard), n
                    assert "Retry-After" in r.headers

    # A fault on one node of each replica: tainted by its owner.
    ours = {*nodes, domain_node}
    faulty = {ctl: sorted(set(ctl.parts.cache.names()) & ours)[0] for ctl in (a, b)}
    for ctl, n in faulty.items():
        connect(ctl.parts.stream.sink, n)
        ctl.parts.stream.sink.on_message(n, fault(n, 1))
    for n in faulty.values():
        await taint_is(kube, n, True, f"{n} tainted by its owner")

    # Moved into b's shard (its domain label changed; the singleton relabels it): it leaves
    # a's cache (left: its taint stays), joins b's.
    moved = faulty[a]
    target = next(iter(owned(b)))
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{moved}",
        body={"metadata": {"labels": {CLIQUE: in_shard(f"{base}-moved", target)}}},
        content_type="application/merge-patch+json",
    )
    await until(lambda: moved not in a.parts.cache.names(), "the node left a's cache")
    await until(lambda: moved in b.parts.cache.names(), "the node joined b's cache")
    await until(lambda: a.parts.fleet.node(moved) is None, "a forgot the node's agent")
    assert tainted(await get_node(kube.api, moved))  # nobody removed it: no positive evidence
    # b, hearing the node's agent report healthy, lifts it (positive evidence).
    connect(b.parts.stream.sink, moved)
    await taint_is(kube, moved, False, "b lifts the moved node's taint on a report")

    # a stops cleanly: b takes every shard; a's taint stays until its agent reports to b.
    still = sorted(set(a.parts.cache.names()) & ours)[0]
    connect(a.parts.stream.sink, still)
    a.parts.stream.sink.on_message(still, fault(still, 0))
    await taint_is(kube, still, True, f"{still} tainted by a")
    await kube.stop(a)
    await until(lambda: owned(b) == frozenset(range(COUNT)), "b owns every shard")
    everyone = set().union(*by_shard.values())
    await until(lambda: everyone <= set(b.parts.cache.names()), "b watches every node")
    await until(lambda: b.parts.shards is not None and b.parts.shards.ready, "b ready")
    assert tainted(await get_node(kube.api, still))  # no report to b yet: kept
    connect(b.parts.stream.sink, still)  # its agent, back at b, reports every GPU healthy
    await taint_is(kube, still, False, "b lifts it on the healthy report")

    namespace = b.parts.cfg.leader.namespace
    for i in range(COUNT):
        lease = await request(
            kube.api,
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
            + shard_lease_name(b.parts.cfg.leader.lease_name, i),
        )
        assert lease["spec"]["holderIdentity"] == "replica-b"


async def taint_is(kube: Cluster, node: str, present: bool, what: str) -> None:
    """Wait until ``node`` carries our unhealthy taint (``present``) or not."""

    async def check() -> bool | None:
        return True if tainted(await get_node(kube.api, node)) == present else None

    seen: bool = await until(check, what)
    assert seen
