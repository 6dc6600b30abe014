"""A decision survives a failover (issue 38, items 1 and 2) against the real API server: two
in-process controllers with the chart's identity and RBAC competing for the release's Lease,
the incidents as GPUIncidents, and a Node WATCH of the test's own that records every change of
every node's taints, so that "no gpuhealth hard taint disappears at any moment" is checked on
every version of every Node, not on samples.

- An NVLink domain incident: the first leader taints the whole domain; it is killed; the
  successor, with no agent reconnected, adopts the incident before its first reconcile and the
  domain taint stays on every member; the members that faulted report a healthy fabric to the
  successor one by one, and only when the last one did does the taint go.
- A GPU blamed under three jobs: the successor adopts the blame; the node keeps its taint
  while its agent is away; when the agent reconnects the GPU is blamed again at once (the
  fleet shows ``gpu-blamed``) and the taint never moved.

Measured and printed (``-s``): the successor's takeover (lease acquired -> incidents adopted,
leader work ready) with the number of incidents it adopted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.node_cache import Change, NodeCache
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.kube.settings import WatchSettings
from localkube import ControlPlane
from tests.integration.controller_helpers import PREFIX, UNHEALTHY, Cluster, cluster
from tests.integration.test_incidents import create_job, delete_namespace, judge_of, xid_event
from tests.support.fleet import connect
from tests.support.protocol import allocation, fabric_fault, gpu_uuid, hello, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

DOMAIN_TAINT = f"{PREFIX}/nvlink-domain"
CLUSTER = "7a0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
LEADER = {
    "leader": {
        "enabled": True,  # the release's Lease
        "lease_duration_s": 4,
        "renew_deadline_s": 3.0,
        "retry_period_s": 1.0,
    },
    "breaker": {"max_fraction": 1.0, "min_nodes": 100},
}


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def hard_taints(view: NodeView) -> frozenset[tuple[str, str]]:
    """(key, effect) of every hard taint of ours on the node."""
    return frozenset(
        (str(t.get("key")), str(t.get("effect")))
        for t in view.taints
        if str(t.get("key", "")).startswith(PREFIX + "/")
        and t.get("effect") in ("NoSchedule", "NoExecute")
    )


@dataclass
class TaintRecorder:
    """Every version of every watched Node the API server sends, with its hard taints of
    ours, as the test's own watch (the product's informer, admin credentials) sees them."""

    nodes: set[str]
    seen: dict[str, list[frozenset[tuple[str, str]]]] = field(default_factory=dict)

    def on_node(self, _change: Change, old: NodeView | None, new: NodeView | None) -> None:
        view = new or old
        if view is None or view.name not in self.nodes:
            return
        taints = hard_taints(new) if new is not None else frozenset()
        history = self.seen.setdefault(view.name, [])
        if not history or history[-1] != taints:
            history.append(taints)

    def lost(self, taint: tuple[str, str]) -> dict[str, list[frozenset[tuple[str, str]]]]:
        """Nodes whose history shows ``taint`` and, at some later version, not."""
        out = {}
        for name, history in self.seen.items():
            had = [taint in h for h in history]
            if True in had and False in had[had.index(True) :]:
                out[name] = history
        return out

    def losses(self) -> dict[str, list[frozenset[tuple[str, str]]]]:
        """Nodes where some hard taint of ours, once seen, is missing from a later version."""
        return {
            name: history
            for name, history in self.seen.items()
            if any(not t <= later for i, t in enumerate(history) for later in history[i + 1 :])
        }

    def has(self, name: str, taint: tuple[str, str]) -> bool:
        history = self.seen.get(name)
        return bool(history) and taint in history[-1]


@asynccontextmanager
async def recorder(
    cp: ControlPlane, nodes: set[str]
) -> AsyncIterator[tuple[TaintRecorder, NodeCache]]:
    api = await make_api_client(str(cp.kubeconfig))
    cache = NodeCache(api, WatchSettings(relist_backoff_s=0.2))
    rec = TaintRecorder(nodes)
    cache.subscribe(rec.on_node)
    task = asyncio.create_task(cache.run(), name="test-node-watch")
    try:
        await asyncio.wait_for(cache.synced.wait(), 15)
        yield rec, cache
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


async def stored(kube: Cluster, kind: str) -> list[dict[str, Any]]:
    data = await request(kube.api, "GET", INCIDENTS)
    return [o for o in data.get("items") or [] if (o.get("status") or {}).get("kind") == kind]


async def _flag(v: bool) -> bool | None:
    return True if v else None


def open_of(ctl: Controller, kind: str) -> list[Any]:
    assert ctl.parts.incidents is not None
    return ctl.parts.incidents.book.list(kind=kind)  # type: ignore[arg-type]


async def takeover(kube: Cluster, one: Controller, two: Controller) -> float:
    """Kill the leader ``one`` (no Lease given up); the seconds from its death until ``two``
    leads with its leader work prepared (incidents adopted)."""
    await kube.stop(one, crash=True)
    t0 = time.monotonic()
    await until(lambda: _flag(two.is_leader), "the successor leads", timeout_s=20)
    await until(lambda: two.parts.leader_work.ready, "the successor's work prepared")
    return time.monotonic() - t0


async def test_a_successor_keeps_the_domain_taint_until_the_members_that_faulted_report(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    domain = f"{CLUSTER}.{unique_name('c')[-6:].replace('-', '')}"
    rack = [
        await kube.node(
            unique_name(f"tray{i}"), kwok=True, labels={"nvidia.com/gpu.clique": domain}
        )
        for i in range(8)
    ]
    faulty = rack[2:6]
    taint = (DOMAIN_TAINT, "NoSchedule")
    async with recorder(kube.cp, set(rack)) as (rec, _):
        cfg = {**LEADER, "domains": {"window_s": 60.0}}
        one = await kube.controller(cfg, identity="one")
        await until(lambda: one.parts.leader_work.ready, "the first leader prepared")
        two = await kube.controller(cfg, identity="two")
        for name in rack:  # the agents reach the leader only (the Service routes to it)
            connect(one.parts.fleet, name)
        now = datetime.now(UTC)
        for name in faulty:
            one.parts.fleet.on_message(name, snapshot(name, 2, faults={0: fabric_fault(now)}))
        await until(
            lambda: all(rec.has(n, taint) for n in rack), "every tray tainted", timeout_s=30
        )

        async def written() -> list[dict[str, Any]] | None:
            objs = await stored(kube, "domain")
            ok = objs and objs[0]["status"].get("domain", {}).get("admitted")
            return objs if ok else None

        (obj,) = await until(written, "the domain incident's GPUIncident written")
        assert sorted(obj["status"]["domain"]["members"]) == sorted(rack)
        assert sorted(obj["status"]["domain"]["faulted"]) == sorted(faulty)
        assert obj["metadata"]["labels"][f"{PREFIX}/incident-state"] == "open"
        # the replica that does not lead shows the same incident, from its watch
        assert two.parts.incidents is not None and not two.is_leader
        shown = await until(
            lambda: two.parts.incidents.shown.list(kind="domain"), "the follower shows it"
        )
        assert [i.key for i in shown] == [domain] and shown[0].decision == "domain taint"

        took = await takeover(kube, one, two)
        await kube.settle(two)
        assert all(rec.has(n, taint) for n in rack), rec.seen
        (incident,) = open_of(two, "domain")
        assert incident.key == domain and incident.decision == "domain taint"
        assert incident.evidence["waiting_nodes"] == len(faulty)
        print(f"\n[takeover] domain incident adopted, leader work ready {took:.2f}s after the kill")

        # agents reconnect to the successor: the healthy trays first, then the faulty ones,
        # one by one; only the last healthy fabric report lifts the taint
        for name in [n for n in rack if n not in faulty]:
            connect(two.parts.fleet, name)
        for name in faulty[:-1]:
            connect(two.parts.fleet, name)
            await kube.settle(two)
            assert all(rec.has(n, taint) for n in rack), f"lifted before {faulty[-1]} reported"
            assert len(open_of(two, "domain")) == 1
        assert rec.lost(taint) == {}, "a domain taint disappeared at some moment"
        connect(two.parts.fleet, faulty[-1])
        await until(
            lambda: not any(rec.has(n, taint) for n in rack), "the taint lifted", timeout_s=30
        )
        assert open_of(two, "domain") == []

        async def closed() -> bool | None:
            objs = await stored(kube, "domain")
            return True if objs and objs[0]["status"]["state"] == "closed" else None

        await until(closed, "the GPUIncident closed")


async def test_a_successor_keeps_a_blamed_gpu_blamed(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("ml")
    await kube.namespace(ns)
    try:
        bad = await kube.node(unique_name("bad"), gpus=2, kwok=True)
        for job in ("a", "b", "c"):
            await create_job(kube, ns, job, [(f"{job}-0", bad)])
        taint = (UNHEALTHY, "NoSchedule")
        async with recorder(kube.cp, {bad}) as (rec, _):
            one = await kube.controller(LEADER, identity="one")
            await until(lambda: one.parts.leader_work.ready, "the first leader prepared")
            two = await kube.controller(LEADER, identity="two")
            judge = judge_of(one)
            judge.on_connect(bad, hello(bad, 2))
            for job in ("a", "b", "c"):
                allocs = [allocation(gpu_uuid(0, bad), f"{job}-0", namespace=ns)]
                judge.on_message(bad, snapshot(bad, 2, allocations=allocs))
                judge.on_message(bad, xid_event(bad, 31))
                await asyncio.sleep(0.05)
            await until(lambda: rec.has(bad, taint), "the blamed GPU's node tainted")

            async def written() -> list[dict[str, Any]] | None:
                objs = await stored(kube, "gpu")
                return objs if objs and objs[0]["status"].get("blame") else None

            (obj,) = await until(written, "the blame's GPUIncident written")
            blame = obj["status"]["blame"]
            assert blame["xid"] == 31 and "3 different jobs" in blame["message"]

            took = await takeover(kube, one, two)
            await kube.settle(two)
            assert rec.has(bad, taint)
            assert two.parts.incidents is not None
            assert list(two.parts.incidents.judge.blamed()) == [(bad, gpu_uuid(0, bad))]
            print(f"\n[takeover] GPU blame adopted, leader work ready {took:.2f}s after the kill")

            # the agent reconnects to the successor: it says GPU 0 is healthy, the fleet
            # shows the controller's verdict, and the taint never moved
            successor = judge_of(two)
            successor.on_connect(bad, hello(bad, 2))
            successor.on_message(bad, snapshot(bad, 2))
            gpu0 = two.parts.fleet.node_health(bad).gpus[0]
            assert gpu0.state == "unhealthy" and gpu0.conditions[-1].code == "gpu-blamed"
            assert gpu0.conditions[-1].message == blame["message"]
            await kube.settle(two)
            assert rec.lost(taint) == {}, rec.seen
            assert rec.has(bad, taint)
    finally:
        await delete_namespace(kube, ns)
