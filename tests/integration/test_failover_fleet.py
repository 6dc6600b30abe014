"""A failover at fleet shape, real processes (issue 38, item 7): the chart's two controller
replicas as ``gpuhealth-controller`` processes (the chart's identity and RBAC, its Lease, its
Service's leader endpoint), against the real kube-apiserver with the Node authorizer and
NodeRestriction; 24 simulated agents (the agent's own stream client, bound tokens of agent
pods) streaming through a Service-like route that follows the leader's EndpointSlice
(:mod:`tests.integration.leader_route`); and the test's own Node WATCH recording every version
of every Node's taints.

Before the kill the leader holds, at once:

- (a) an NVLink domain incident: 4 of an 18-tray domain report a degraded fabric, all 18 trays
  carry the domain taint;
- (b) a GPU blame: XID 31 on one GPU under three jobs, its node tainted;
- (c) an open breaker (a budget of 20 nodes: the domain, the blamed node and one of three
  more faulty nodes), two faulty nodes held untainted, the state stored in its ConfigMap.

The leader is killed with SIGKILL. The standby takes the Lease, loads the breaker, adopts the
incidents, publishes itself as the Service's endpoint; the agents come back through the route
to it. Throughout, no gpuhealth hard taint disappears from any node at any version the watch
saw, the held nodes stay untainted (the breaker stays open, its ConfigMap ``open``), and the
successor's incidents are the predecessor's. Then the faulted trays report a healthy fabric and
the domain taint goes (the successor acts, and the watch would have seen a loss).

The same with the successor's first reads failing, until the test lets them through:

- ``403``: the breaker ConfigMap's ``get`` and the GPUIncidents' ``list`` taken out of the
  release's Role and ClusterRole (RBAC not there yet);
- ``500``: the same on a control plane whose authorizer fails what RBAC does not allow
  (test_breaker_load.py's webhook authorizer at a closed port);
- ``404``: the GPUIncident CRD's version not served (a CRD replaced, an API server
  restarting) after the standby's watch has listed it: the adoption's LIST is answered 404.

Meanwhile the successor leads but is not ready (``/readyz`` 503) and refuses the agents
nothing it could act on: the taints stay as they were.

Measured and printed (``-s``): kill -> successor ready, kill -> every agent back through the
route, reads refused meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from demo.cluster import AGENT_DAEMONSET, agent_daemonset_uid
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.rest import NotFoundError, request
from localkube import ControlPlane
from localkube.objects import pod_body, request_bound_token
from localkube.process import free_port
from tests.integration.controller_helpers import (
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    controller_process,
    get_node,
    merge,
    our_taints,
)
from tests.integration.leader_route import LeaderRoute
from tests.integration.remediation_procs import (
    CONTROLLER_REMEDIATION,
    XID48,
    Loop,
    merged,
    scenario,
)
from tests.integration.remediation_procs import (
    XID79 as FALLEN_OFF_THE_BUS,
)
from tests.integration.stream_agents import SimAgent, running
from tests.integration.test_breaker_load import RBAC, _fresh, refusing
from tests.integration.test_incident_takeover import recorder
from tests.integration.test_incidents import create_job, delete_namespace
from tests.integration.test_remediation_procs import agent_log
from tests.integration.test_watch_not_found import INCIDENT_CRD_PATH, _served
from tests.support.protocol import HOT, XID79, allocation, fabric_fault, gpu_uuid
from tests.support.wait import until

pytestmark = pytest.mark.integration

TRAYS = 18
FAULTED = range(2, 6)
STORM = 3
BYSTANDERS = 2
BUDGET = TRAYS + 1 + 1
"""The breaker's budget: the domain, the blamed node and one more."""
DOMAIN = (f"{PREFIX}/nvlink-domain", "NoSchedule")
TAINT = (UNHEALTHY, "NoSchedule")
DEGRADED = f"{PREFIX}/degraded"
CLIQUE = "7a0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
POD_IPS = ("10.244.0.2", "10.244.0.3")
"""The replicas' pod IPs, as published in the Service's EndpointSlice (which refuses loopback
addresses)."""
HOSTS = ("127.0.0.2", "127.0.0.3")
"""Where each replica listens: its own loopback address, one port for both (two pods)."""
SETTINGS: dict[str, Any] = {
    "leader": {
        "lease_duration_s": 4,
        "renew_deadline_s": 3.0,
        "retry_period_s": 1.0,
        "endpoint_interval_s": 1.0,
    },
    "breaker": {
        "max_fraction": 0.0,
        "min_nodes": BUDGET,
        "sync_interval_s": 0.1,
        "load_backoff_s": 0.2,
        "load_backoff_max_s": 0.5,
    },
    "incidents": {"retry_backoff_s": 0.2, "retry_backoff_max_s": 0.5},
    "domains": {"window_s": 120.0, "evaluate_interval_s": 0.5},
    "watch": {"relist_backoff_s": 0.2, "relist_backoff_max_s": 1.0},
    "extender": {"enabled": False},
}
FAULTS = ("none", "403", "500", "404")


@pytest.fixture(params=FAULTS)
async def failing(
    request: pytest.FixtureRequest, kube_assets: Path, tmp_path: Path
) -> AsyncIterator[tuple[str, Cluster]]:
    """How the successor's first reads fail, and the cluster they fail on."""
    async with refusing(request.param, request, kube_assets, tmp_path) as c:
        yield request.param, c


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


class Replica:
    """One controller process: its address (the pod IP the leader publishes) and /metrics."""

    def __init__(self, proc: subprocess.Popen[bytes], base: str, http: aiohttp.ClientSession):
        self.proc = proc
        self.base = base
        self.http = http

    async def status(self, path: str) -> int | None:
        try:
            async with self.http.get(self.base + path) as resp:
                return resp.status
        except aiohttp.ClientError:
            return None

    async def metric(self, name: str) -> float:
        """The sum of every sample of ``name`` (0 when absent or unreachable)."""
        try:
            async with self.http.get(self.base + "/metrics") as resp:
                text = await resp.text()
        except aiohttp.ClientError:
            return 0.0
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        )

    async def leads_ready(self) -> bool | None:
        return True if await self.status("/readyz") == 200 else None


Restore = Callable[[], Awaitable[None]]
LOADS = "gpuhealth_circuit_breaker_load_errors_total"
ADOPTIONS = "gpuhealth_incident_adoption_failures_total"


async def _refused_reads(kube: Cluster, fault: str) -> list[tuple[str, Restore]]:
    """Make the successor's first reads fail as ``fault`` says; the steps that let them through
    again, in order: (the metric that counts the refusals, what puts the read back).

    ``403``/``500``: ``get`` of the breaker ConfigMap out of the release's Role, ``list`` of
    GPUIncidents out of its ClusterRole (the breaker is loaded first, then the incidents).
    ``404``: the GPUIncident CRD's version not served."""
    if fault == "404":
        await _served(kube, False, INCIDENT_CRD_PATH)
        return [(ADOPTIONS, lambda: _served(kube, True, INCIDENT_CRD_PATH))]
    release = await kube.release()
    role = f"{RBAC}/namespaces/{release.namespace}/roles/{release.controller_fullname}"
    crole = f"{RBAC}/clusterroles/{release.controller_fullname}"
    saved = {path: _fresh(await request(kube.api, "GET", path)) for path in (role, crole)}
    cut = copy.deepcopy(saved)
    for rule in cut[role]["rules"]:
        if rule.get("resourceNames") == [release.config["breaker"]["configmap"]]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "get"]
    for rule in cut[crole]["rules"]:
        if rule["resources"] == ["gpuincidents"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    for path, body in cut.items():
        await request(kube.api, "PUT", path, body=body)

    async def put(path: str) -> None:
        await request(kube.api, "PUT", path, body=saved[path])

    return [(LOADS, lambda: put(role)), (ADOPTIONS, lambda: put(crole))]


async def _service(kube: Cluster) -> str:
    """The chart's controller Service (no selector: the leader publishes its endpoint)."""
    release = await kube.release()
    name = release.controller_fullname
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
    }
    await request(kube.api, "POST", f"/api/v1/namespaces/{release.namespace}/services", body=body)
    return name


@dataclass
class Pair:
    """The chart's two replicas behind the route; ``one`` leads (ready) when made."""

    route: LeaderRoute
    one: Replica
    two: Replica
    port: int
    tmp: Path

    def logs(self) -> str:
        return "\n".join(
            f"replica{i}:\n" + (self.tmp / f"replica{i}.log").read_text()[-4000:]
            for i in range(2)
            if (self.tmp / f"replica{i}.log").exists()
        )


async def _pair(
    stack: AsyncExitStack, kube: Cluster, tmp_path: Path, settings: dict[str, Any]
) -> Pair:
    """The Service, the route, and the two replicas as processes (closed with ``stack``)."""
    release = await kube.release()
    service = await _service(kube)
    overrides = {**settings, "leader": {**settings["leader"], "service": service}}
    http = await stack.enter_async_context(aiohttp.ClientSession())
    pods = dict(zip(POD_IPS, HOSTS, strict=True))
    route = await stack.enter_async_context(
        LeaderRoute(kube.api, release.namespace, service, pods).running()
    )
    port = free_port()  # both replicas, each on its own address

    async def replica(i: int) -> Replica:
        proc, base = await stack.enter_async_context(
            controller_process(
                kube,
                tmp_path,
                overrides,
                port=port,
                host=HOSTS[i],
                log_name=f"replica{i}.log",
                env={"POD_NAME": f"replica-{i}", "POD_IP": POD_IPS[i]},
            )
        )
        return Replica(proc, base, http)

    one = await replica(0)
    await until(one.leads_ready, "the first replica leads, ready", timeout_s=30)
    return Pair(route, one, await replica(1), port, tmp_path)


async def test_a_killed_leader_loses_no_taint_at_fleet_shape(
    failing: tuple[str, Cluster], unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    fault, kube = failing
    tag = unique_name("f")[-6:]
    trays = [
        await kube.node(f"tray{i}-{tag}", labels={"nvidia.com/gpu.clique": f"{CLIQUE}.{tag}"})
        for i in range(TRAYS)
    ]
    blamed = await kube.node(f"blamed-{tag}")
    storm = [await kube.node(f"storm{i}-{tag}") for i in range(STORM)]
    bystanders = [await kube.node(f"quiet{i}-{tag}") for i in range(BYSTANDERS)]
    nodes = [*trays, blamed, *storm, *bystanders]
    ns = unique_name("ml")
    await kube.namespace(ns)
    for job in ("a", "b", "c"):
        await create_job(kube, ns, job, [(f"{job}-0", blamed)])
    try:
        await _failover(fault, kube, nodes, trays, blamed, storm, bystanders, ns, tmp_path)
    finally:
        await delete_namespace(kube, ns)


async def _failover(
    fault: str,
    kube: Cluster,
    nodes: list[str],
    trays: list[str],
    blamed: str,
    storm: list[str],
    bystanders: list[str],
    ns: str,
    tmp_path: Path,
) -> None:
    release = await kube.release()
    tokens = dict(zip(nodes, await asyncio.gather(*(kube.agent(n) for n in nodes)), strict=True))

    async with AsyncExitStack() as stack:
        pair = await _pair(stack, kube, tmp_path, SETTINGS)
        route, one, two, port, logs = pair.route, pair.one, pair.two, pair.port, pair.logs
        rec, _ = await stack.enter_async_context(recorder(kube.cp, set(nodes)))
        agents = {
            n: SimAgent(route.url, n, tokens[n][1], tmp_path / "agents" / n, gpus=2) for n in nodes
        }
        await stack.enter_async_context(running(list(agents.values())))
        await until(
            lambda: all(a.connected for a in agents.values()) or None,
            "every agent connected through the route",
            timeout_s=30,
        )

        # (a) the domain incident
        now = datetime.now(UTC)
        for i in FAULTED:
            agents[trays[i]].set_fault(0, fabric_fault(now))
        await until(
            lambda: all(rec.has(n, DOMAIN) for n in trays) or None,
            "the whole domain tainted",
            timeout_s=30,
        )
        # (b) XID 31 on one GPU under three jobs
        for job in ("a", "b", "c"):
            agents[blamed].allocate([allocation(gpu_uuid(0, blamed), f"{job}-0", namespace=ns)])
            agents[blamed].xid(0, 31)
            await agents[blamed].delivered()
        await until(lambda: rec.has(blamed, TAINT) or None, "the blamed GPU's node tainted")
        # (c) three more faulty nodes: one fits the budget, two are held
        for n in storm:
            agents[n].set_fault(0, XID79)
        cm_path = f"/api/v1/namespaces/{release.namespace}/configmaps/"
        cm_path += release.config["breaker"]["configmap"]

        async def breaker() -> dict[str, str] | None:
            try:
                data = (await request(kube.api, "GET", cm_path)).get("data") or {}
            except NotFoundError:
                return None
            return data if data.get("state") == "open" else None

        try:
            stored = await until(breaker, "the open breaker stored", timeout_s=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{rec.seen}\n{logs()}") from exc
        tainted = [n for n in storm if rec.has(n, TAINT)]
        held = [n for n in storm if n not in tainted]
        assert len(tainted) == 1, rec.seen
        assert all(n in stored["window"] for n in [*trays, blamed, *tainted])

        async def incidents() -> dict[str, dict[str, Any]] | None:
            items = (await request(kube.api, "GET", INCIDENTS)).get("items") or []
            by_kind = {o["status"].get("kind"): o["status"] for o in items if o.get("status")}
            ok = (by_kind.get("domain") or {}).get("domain", {}).get("admitted") and (
                by_kind.get("gpu") or {}
            ).get("blame")
            return by_kind if ok else None

        before = await until(incidents, "the domain and the blame written as GPUIncidents")
        assert sorted(before["domain"]["domain"]["members"]) == sorted(trays)
        assert not rec.losses(), rec.seen
        refused_before = route.refused

        # SIGKILL the leader; the successor's first reads fail as asked
        os.kill(one.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        steps = await _refused_reads(kube, fault) if fault != "none" else []
        refused = 0.0
        try:
            if steps:
                await until(
                    lambda: two.metric("gpuhealth_controller_is_leader"),
                    "the standby leads",
                    timeout_s=20,
                )
            for metric, let_through in steps:
                for n in (1, 3, 5):  # refused again and again: not ready, nothing moves
                    try:
                        await until(lambda n=n, m=metric: _at_least(two, m, n), f"{n} x {metric}")
                    except AssertionError as exc:
                        raise AssertionError(f"{exc}; lost: {rec.losses()}\n{logs()}") from exc
                    assert await two.status("/readyz") == 503
                    assert not rec.losses(), rec.seen
                    assert not any(rec.has(n, TAINT) for n in held)
                refused += await two.metric(metric)
                await let_through()
        finally:
            for _, let_through in steps:
                await let_through()
        await until(two.leads_ready, "the successor ready", timeout_s=30)
        ready_s = time.monotonic() - killed
        successor = (POD_IPS[1], port)
        await until(
            lambda: (
                (
                    route.routed[successor] >= len(nodes)
                    and all(a.connected for a in agents.values())
                )
                or None
            ),
            "every agent back, through the route, at the successor",
            timeout_s=30,
        )
        back_s = time.monotonic() - killed
        # the successor took every reconnected node into account: it acts on a report sent
        # after all of theirs (its queue is first in, first out)
        connected = "gpuhealth_controller_connected_agents"
        await until(lambda: _at_least(two, connected, len(nodes)), "the successor has them")
        for a in agents.values():
            await a.delivered()
        agents[bystanders[0]].set_fault(1, HOT)

        async def sentinel() -> bool | None:
            taints = our_taints(await get_node(kube.api, bystanders[0]))
            return True if any(t[0] == DEGRADED for t in taints) else None

        await until(sentinel, "the successor acted on a later report")

        assert not rec.losses(), rec.seen
        assert all(rec.has(n, DOMAIN) for n in trays)
        assert rec.has(blamed, TAINT) and all(rec.has(n, TAINT) for n in tainted)
        assert not any(rec.has(n, TAINT) for n in [*held, *bystanders]), rec.seen
        data = await breaker()
        assert data is not None and data["window"] == stored["window"], data
        after = await until(incidents, "the incidents, adopted")
        assert after["domain"]["openedAt"] == before["domain"]["openedAt"]
        assert after["gpu"]["blame"] == before["gpu"]["blame"]
        print(
            f"\n[failover {fault}] {len(nodes)} nodes: successor ready {ready_s:.2f}s after the "
            f"kill, every agent back {back_s:.2f}s after it"
            + (f", {refused:.0f} reads refused" if steps else "")
            + f", {route.refused - refused_before} connections refused meanwhile; "
            "no hard taint lost"
        )

        # the faulted trays report a healthy fabric: the successor lifts the domain taint
        for i in FAULTED:
            agents[trays[i]].set_fault(0, None)
        await until(
            lambda: not any(rec.has(n, DOMAIN) for n in trays) or None,
            "the domain taint lifted by the successor",
            timeout_s=30,
        )
        assert rec.has(blamed, TAINT)


async def _at_least(replica: Replica, name: str, n: float) -> bool | None:
    return True if await replica.metric(name) >= n else None


REMEDIATING = merge(
    SETTINGS,
    {
        "allow_plaintext_orders": True,  # ws:// on 127.0.0.1 (TLS: test_controller_tls.py)
        "breaker": {"max_fraction": 1.0, "min_nodes": 1},
        "remediation": merged(
            CONTROLLER_REMEDIATION,
            {
                "validation": {"soak_s": 300, "timeout_s": 400},  # held in Validating
                "reboot": {"order_timeout_s": 300},  # the node is not back: Remediating
                "safety": {"max_concurrent": 3},  # the fourth active episode waits
            },
        ),
    },
)
QUARANTINE = (f"{PREFIX}/remediation", "NoSchedule")


@dataclass
class RebootWebhook:
    """A cloud's reboot API as the agent's webhook executor calls it: accepts at once, counts."""

    url: str
    posts: int = 0


@asynccontextmanager
async def _reboot_webhook() -> AsyncIterator[RebootWebhook]:
    hook = RebootWebhook("")

    async def accept(_request: web.Request) -> web.Response:
        hook.posts += 1
        return web.json_response({"accepted": True})

    app = web.Application()
    app.router.add_post("/reboot", accept)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    hook.url = f"http://127.0.0.1:{port}/reboot"
    try:
        yield hook
    finally:
        await runner.cleanup()


async def _daemonset_agents(kube: Cluster, nodes: list[str]) -> dict[str, str]:
    """An agent pod on each node owned by a DaemonSet of the release, as the chart's are (a
    drain never evicts them), and its bound token."""
    release = await kube.release()
    ns, sa = release.namespace, release.agent_service_account
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": AGENT_DAEMONSET,
        "uid": await agent_daemonset_uid(kube.api, ns),
    }
    tokens = {}
    for node in nodes:
        body = pod_body(f"agent-{node}", node_name=node, service_account=sa)
        body["metadata"]["ownerReferences"] = [owner]
        pod = await client.CoreV1Api(kube.api).create_namespaced_pod(ns, body)
        tokens[node] = await request_bound_token(kube.api, ns, sa, pod, "gpuhealth")
    return tokens


async def test_a_killed_leader_resumes_every_episode_where_it_was(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """(d) SIGKILL the leader while one episode is Escalated (its resets failed), one
    remediates (a reboot the node's webhook accepted, the node not back yet), one validates
    (reset done, soaking), one drains (a pod it waits for) and one waits in Pending (the
    concurrency cap), 12 more nodes streaming: no hard taint of ours disappears at any
    moment, the successor keeps every episode in its phase (one GPURemediation per node, no
    second reset, no second reboot), and resumes them: when the drained pod goes, the
    successor resets that node's GPU once."""
    kube.chart_values = {"remediation": {"enabled": True}}
    release = await kube.release()
    tag = unique_name("r")[-6:]
    escalated, rebooting, validating, draining, pending = [
        await kube.node(f"{p}-{tag}") for p in ("e", "r", "v", "d", "p")
    ]
    quiet = [await kube.node(f"quiet{i}-{tag}") for i in range(12)]
    ns = unique_name("train")
    await kube.namespace(ns)
    settings = merge(
        REMEDIATING,
        {
            "remediation": {
                "drain": {
                    "rules": [
                        {"namespaces": [ns], "mode": "wait", "wait_s": 300, "grace_period_s": 0}
                    ],
                    "timeout_s": 400,
                }
            }
        },
    )
    pod = pod_body("trainer", node_name=draining, gpus=1)
    await request(kube.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=pod)
    loop = Loop(release.kubeconfig, kube.api, tmp_path, "unused")
    real = (escalated, rebooting, validating, draining, pending)
    nodes = [*real, *quiet]
    tokens = dict(zip(quiet, await asyncio.gather(*(kube.agent(n) for n in quiet)), strict=True))
    for n, token in (await _daemonset_agents(kube, list(real))).items():
        path = tmp_path / f"{n}.token"
        path.write_text(token)
        loop.tokens[n] = path
    try:
        async with AsyncExitStack() as stack:
            pair = await _pair(stack, kube, tmp_path, settings)
            loop.url = pair.route.url
            rec, _ = await stack.enter_async_context(recorder(kube.cp, set(nodes)))
            sims = [SimAgent(pair.route.url, n, tokens[n][1], tmp_path / n, 2) for n in quiet]
            await stack.enter_async_context(running(sims))

            async def in_phase(node: str, phase: str) -> bool | None:
                p = await loop.phase(node)
                return True if p is not None and p[0] == phase else None

            # a reset command that names no GPU fails: retried, then escalated
            failing = {"remediation": {"reset": {"command": ["nvidia-smi", "--gpu-reset"]}}}
            loop.start_agent(escalated, scenario(*XID48), failing)
            await until(lambda: in_phase(escalated, "Escalated"), "Escalated", timeout_s=60)
            # a reboot handed to the node's webhook (accepted at once); the node never comes
            # back with a new boot: the episode stays in Remediating
            reboots = await stack.enter_async_context(_reboot_webhook())
            webhook = {"executor": "webhook", "webhook_url": reboots.url, "delay_s": 0}
            loop.start_agent(
                rebooting, scenario(*FALLEN_OFF_THE_BUS), {"remediation": {"reboot": webhook}}
            )
            await until(lambda: reboots.posts or None, "the reboot handed over", timeout_s=60)
            await until(lambda: in_phase(rebooting, "Remediating"), "Remediating")
            for node, phase in ((validating, "Validating"), (draining, "Draining")):
                loop.start_agent(node, scenario(*XID48))
                try:
                    await until(lambda n=node, p=phase: in_phase(n, p), phase, timeout_s=60)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{pair.logs()}\n{loop.logs()}") from exc
            loop.start_agent(pending, scenario(*XID48))
            await until(lambda: in_phase(pending, "Pending"), "Pending", timeout_s=60)
            await until(lambda: rec.has(pending, TAINT) or None, "the pending node tainted")
            assert rec.has(validating, QUARANTINE) and rec.has(draining, QUARANTINE)
            before = {n: await loop.phase(n) for n in real}
            failed_resets = agent_log(loop, escalated).count('"gpu_reset_failed"')
            assert failed_resets >= 1
            # what must stay: the quarantines, and the taint of the GPUs still faulty (the
            # validated GPU was reset: its agent's healthy reports may lift its taint)
            keep = {
                escalated: {QUARANTINE, TAINT},
                rebooting: {QUARANTINE, TAINT},
                validating: {QUARANTINE},
                draining: {QUARANTINE, TAINT},
                pending: {TAINT},
            }
            for n, taints in keep.items():
                assert taints <= rec.seen[n][-1], rec.seen[n]
            mark = {n: len(rec.seen[n]) - 1 for n in keep}

            def dropped() -> dict[str, list[frozenset[tuple[str, str]]]]:
                """Nodes where a taint ``keep`` names is missing from a version seen since
                the kill."""
                return {
                    n: rec.seen[n][mark[n] :]
                    for n, taints in keep.items()
                    if any(not taints <= v for v in rec.seen[n][mark[n] :])
                }

            os.kill(pair.one.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            await until(pair.two.leads_ready, "the successor ready", timeout_s=30)
            ready_s = time.monotonic() - killed
            connected = "gpuhealth_controller_connected_agents"
            await until(
                lambda: _at_least(pair.two, connected, len(nodes)),
                "every agent back at the successor",
                timeout_s=30,
            )
            back_s = time.monotonic() - killed
            # the successor acts on a later report: every earlier one was taken into account
            sims[0].set_fault(1, HOT)

            async def sentinel() -> bool | None:
                taints = our_taints(await get_node(kube.api, quiet[0]))
                return True if any(t[0] == DEGRADED for t in taints) else None

            await until(sentinel, "the successor acted on a later report")
            assert {n: await loop.phase(n) for n in real} == before
            assert not dropped(), rec.seen
            assert agent_log(loop, validating).count('"gpu_reset"') == 1
            assert '"gpu_reset"' not in agent_log(loop, draining)
            assert agent_log(loop, escalated).count('"gpu_reset_failed"') == failed_resets
            assert reboots.posts == 1

            # the pod the drain waits for goes: the successor resets that GPU, once
            await request(
                kube.api,
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods/trainer",
                query=[("gracePeriodSeconds", "0")],
            )
            try:
                await until(lambda: in_phase(draining, "Validating"), "resumed", timeout_s=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{pair.logs()}\n{loop.logs()}") from exc
            assert agent_log(loop, draining).count('"gpu_reset"') == 1
            assert agent_log(loop, validating).count('"gpu_reset"') == 1
            assert reboots.posts == 1
            assert await in_phase(pending, "Pending")  # the cap still holds it
            keep[draining] = {QUARANTINE}  # reset now: healthy reports may lift the other
            assert not dropped(), rec.seen
            assert len([e for e in await loop.episodes() or [] if e]) == len(real)
            print(
                f"\n[failover remediation] {len(nodes)} nodes, episodes {before}: successor "
                f"ready {ready_s:.2f}s after the kill, every agent back {back_s:.2f}s; "
                "phases kept, one reset each, no hard taint lost"
            )
    finally:
        loop.stop()
        await delete_namespace(kube, ns)
