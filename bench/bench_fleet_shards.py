"""The controller past one process: N nodes cut into S shards over R replicas (issue 43).

``fleet_shards``: a fresh localkube control plane (etcd, kube-apiserver); the chart's
controller identity and configuration (``tests/integration/chart_identity.py``, with the
chart values ``shards.count`` and ``controller.replicas``); the release's Service and each
shard's Service (``<leader.service>-shard-<i>``, selector-less); N GPU Nodes, each labelled at
creation with its shard (``Keys.shard_label`` = ``shard_of(name, S)``, as the singleton's
labeller would), an agent pod on each and a bound token (:func:`bench.bench_fleet_scale._populate`);
R real ``gpuhealth-controller`` processes, each with the chart's identity, its own loopback
address and pod IP (``POD_NAME``, ``POD_IP``: the owner of shard ``i`` publishes
``<service>-shard-<i>-leader`` with it), configured ``shards: {count: S, replicas: R}`` and
``leader.service`` (:data:`OVERRIDES` of ``fleet_scale`` on top: plain HTTP, no remediation).
The agents are ``WORKERS`` separate processes (:mod:`bench.fleet_scale_agents`, sending what
the real agent sends on a busy node), each agent connecting to its shard's owner at the address
that shard's EndpointSlice names when it connects (each process follows the slices as the
kube-proxy of its nodes would: :class:`tests.integration.leader_route.ShardEndpoints`), and
reconnecting by itself when its stream ends. With S = 1 it is the leader's Service: today's
controller, a leader and R - 1 standbys.

Measured, in order:

- ``connect_all_s``: every agent told to connect at once, until the last one's Snapshot is
  acknowledged (the cold start of the fleet); ``misplaced_agents``: after the replicas settled,
  how far each replica's connected agents are from the nodes of the shards it owns (its
  Leases; 0: every agent reached its shard's owner and no other);
- steady state (``STEADY_S``, real heartbeats): each replica's CPU (% of one core) and RSS
  (median of samples): the highest of each (``steady_cpu_pct_max``, ``steady_rss_mib_max``),
  the sum of RSS, CPU per heartbeat over all replicas; the agents' processes' CPU;
- ``FAULTS_PER_SHARD`` XID 79 faults on nodes of every shard, one at a time: the time from the
  agent's send to the Node watch showing the NoSchedule taint (p50, p99), and
  ``fault_taints_elsewhere``: taint writes counted by a replica that does not own the node's
  shard (0: each fault tainted by its owner);
- from here to the end the bench's own Node watch records every version of the faulted Nodes
  (:class:`tests.integration.test_incident_takeover.TaintRecorder`): ``hard_taints_lost``,
  nodes where a hard taint of ours once seen is missing from a later version (0: no tainted
  node was schedulable at any moment);
- the owner of shard 0 SIGKILLed: ``kill_agents_back_s``, from the kill until every agent of
  the shards it owned is connected again (their Leases expire, other replicas take them, their
  slices move); ``kill_shards_untaken`` (its shards without a live owner then) and
  ``kill_other_shards_reconnected``: streams of other shards' agents that ended (0);
- a replica added: for ``ADD_WATCH_S`` (past ``shards.takeover_after_s``) nothing may move:
  ``add_shards_moved`` (Leases that changed holder), ``add_agents_reconnected``; the added
  replica's CPU and RSS holding no shard (``spare_cpu_pct``, ``spare_rss_mib``);
- a replica removed cleanly (SIGTERM to the live one owning the most shards):
  ``remove_agents_back_s``, ``remove_shards_untaken``, ``remove_other_shards_reconnected``,
  its exit code;
- the projection to 100,000 nodes from those figures (:func:`projection`): each replica's
  RSS and CPU above a spare's, per node it owns, the highest; replicas so that each stays
  inside the one-process envelope (20,000 nodes, 768 MiB, 20 % of a core) plus one spare; the
  total memory (``projected_100k_memory_gib``: goal at most 8 GiB).

Sizes (environment): ``GPUHEALTH_BENCH_SHARDS_N`` (nodes, default 40,000),
``GPUHEALTH_BENCH_SHARDS_S`` (shards, 8), ``GPUHEALTH_BENCH_SHARDS_R`` (replicas, 4),
``GPUHEALTH_BENCH_SHARDS_WORKERS`` (agents' processes, 8). A smoke run:
``GPUHEALTH_BENCH_SHARDS_N=3000 GPUHEALTH_BENCH_SHARDS_S=3 GPUHEALTH_BENCH_SHARDS_R=4 python -m
bench -k fleet_shards``; the whole one: ``python -m bench -k fleet_shards --merge`` (into
bench/results.json). ``GPUHEALTH_BENCH_SCALE_LOCK`` and ``GPUHEALTH_BENCH_SCALE_LOGS`` as for
``fleet_scale``. Leadership timings are the chart's (a Lease of 15 s, a takeover after 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from bench.bench_fleet_scale import (
    KEEP_LOGS,
    LOCK,
    OVERRIDES,
    _connect_all,
    _fault_to_taint_ms,
    _hear,
    _held,
    _lease_missed,
    _metrics,
    _populate,
    _proc_hwm_mib,
    _Round,
    _say,
    _settle,
    _sum,
    _tail,
    _workers,
)
from bench.bench_stream import _proc_cpu_s, _proc_rss_mib, _raise_nofile
from bench.registry import Benchmark, Target
from bench.stats import percentile
from gpuhealth.controller.shards.leases import shard_lease_name, shard_service_name
from gpuhealth.protocol.shards import shard_of

N = int(os.environ.get("GPUHEALTH_BENCH_SHARDS_N", "40000"))
SHARDS = int(os.environ.get("GPUHEALTH_BENCH_SHARDS_S", "8"))
REPLICAS = int(os.environ.get("GPUHEALTH_BENCH_SHARDS_R", "4"))
WORKERS = int(os.environ.get("GPUHEALTH_BENCH_SHARDS_WORKERS", "8"))
"""Agents' processes; each drives N / WORKERS agents."""
FAULTS_PER_SHARD = 3
STEADY_S = 30.0
"""Three heartbeat periods."""
ADD_WATCH_S = 40.0
"""How long nothing may move after a replica is added: past the chart's
``shards.takeover_after_s`` (30 s)."""
BACK_MAX_S = 600.0
"""Most the bench waits for a killed or removed replica's agents to be back."""
QUIET_S = 5.0
"""After a replica's agents are back, how long the others are watched for streams that end."""
PROJECTED_NODES = 100_000
ENVELOPE_NODES, ENVELOPE_RSS_MIB, ENVELOPE_CPU_PCT = 20_000, 768.0, 20.0
"""The one-process envelope every replica must stay inside (issue 43)."""
BACK_S = 120.0
"""Most a moved shard's agents may take to be back (as a cold start's)."""
POD_NET = "10.244.7."
HOST_NET = "127.0.7."
"""Replica ``i``'s pod IP (``10.244.7.<i+1>``, published in its slices) and the loopback
address it listens on (``127.0.7.<i+1>``; the agents' own addresses are 127.1.0.1 upwards)."""


@dataclass(frozen=True)
class Plan:
    """One run's sizes and the replicas' configuration on top of the chart's."""

    nodes: int = N
    shards: int = SHARDS
    replicas: int = REPLICAS
    workers: int = WORKERS
    faults_per_shard: int = FAULTS_PER_SHARD
    steady_s: float = STEADY_S
    add_watch_s: float = ADD_WATCH_S
    settings: dict[str, Any] = field(default_factory=dict)
    """Controller settings over the chart's and :data:`OVERRIDES` (e.g. faster Leases)."""


@dataclass
class Replica:
    index: int
    proc: subprocess.Popen[bytes]
    base: str

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def pod_ip(self) -> str:
        return f"{POD_NET}{self.index + 1}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class AgentShard:
    """One shard's agents as the agents' processes report them (summed over processes)."""

    agents: int = 0
    live: int = 0
    lost: int = 0
    back_at: float = 0.0


class Fleet:
    """The control plane's release, its replicas, the agents' processes and what they see."""

    def __init__(self, plan: Plan, kube: Any, workdir: Path, stack: AsyncExitStack) -> None:
        self.plan = plan
        self.kube = kube
        self.workdir = workdir
        self.stack = stack
        self.helpers: Any = importlib.import_module("tests.integration.controller_helpers")
        self.replicas: dict[int, Replica] = {}
        self.port = 0
        self.http: aiohttp.ClientSession | None = None
        self.procs: list[subprocess.Popen[str]] = []
        self.release: Any = None
        self.endpoints: Any = None
        self.sizes = [0] * plan.shards
        for i in range(plan.nodes):
            self.sizes[shard_of(node_name(i), plan.shards)] += 1

    # -- the release ---------------------------------------------------------------------------

    async def services(self) -> str:
        """The release's Service and each shard's (selector-less: owners publish their
        slices); its name, ``leader.service``."""
        from gpuhealth.controller.kube.rest import ConflictError, request

        self.release = await self.kube.release()
        name = str(self.release.controller_fullname)
        names = [name] + [shard_service_name(name, i) for i in range(self.plan.shards)]
        for svc in names:
            body = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": svc},
                "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
            }
            path = f"/api/v1/namespaces/{self.release.namespace}/services"
            with contextlib.suppress(ConflictError):  # the chart made it
                await request(self.kube.api, "POST", path, body=body)
        return name

    def settings(self, service: str) -> dict[str, Any]:
        merge = self.helpers.merge
        shards = {"count": self.plan.shards, "replicas": self.plan.replicas}
        mine = {"leader": {"service": service}, "shards": shards}
        return dict(merge(merge(OVERRIDES, self.plan.settings), mine))

    def pods(self) -> dict[str, str]:
        """Every replica's pod IP (the added one's too) and the address it listens on."""
        return {f"{POD_NET}{i + 1}": f"{HOST_NET}{i + 1}" for i in range(self.plan.replicas + 1)}

    async def start_replica(self, index: int, service: str) -> Replica:
        proc, base = await self.stack.enter_async_context(
            self.helpers.controller_process(
                self.kube,
                self.workdir,
                self.settings(service),
                port=self.port,
                host=f"{HOST_NET}{index + 1}",
                log_name=f"replica{index}.log",
                env={"POD_NAME": f"replica-{index}", "POD_IP": f"{POD_NET}{index + 1}"},
            )
        )
        replica = Replica(index, proc, base)
        self.replicas[index] = replica
        return replica

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.alive]

    # -- who owns what -------------------------------------------------------------------------

    async def holders(self) -> list[str]:
        """Each shard's Lease holder (the one Lease with one shard); empty when none."""
        from gpuhealth.controller.kube.rest import NotFoundError, request

        lease = str(self.release.config["leader"]["lease_name"])
        ns = self.release.namespace
        out = []
        for i in range(self.plan.shards):
            name = lease if self.plan.shards == 1 else shard_lease_name(lease, i)
            path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"
            try:
                spec = (await request(self.kube.api, "GET", path)).get("spec") or {}
            except NotFoundError:
                spec = {}
            out.append(str(spec.get("holderIdentity") or ""))
        return out

    async def owners(self) -> list[Replica | None]:
        """Each shard's owner: a live replica holding its Lease whose pod its slice names."""
        holders = await self.holders()
        by_name = {r.name: r for r in self.live()}
        out: list[Replica | None] = []
        for i, holder in enumerate(holders):
            r = by_name.get(holder)
            target = self.endpoints.targets[i]
            out.append(r if r is not None and target and target[0] == r.pod_ip else None)
        return out

    async def until_owned(self, timeout_s: float) -> list[Replica]:
        """Until every shard has an owner; returns them, by shard."""
        deadline = time.monotonic() + timeout_s
        while True:
            owners = await self.owners()
            if all(owners):
                return [o for o in owners if o is not None]
            if time.monotonic() > deadline:
                raise RuntimeError(f"shards without an owner after {timeout_s:g} s: {owners}")
            await asyncio.sleep(0.5)

    # -- the agents ----------------------------------------------------------------------------

    def route(self, service: str, kubeconfig: str) -> list[str]:
        """The agents' processes' arguments to reach each shard's owner."""
        argv = ["--shards", str(self.plan.shards), "--kubeconfig", kubeconfig]
        argv += ["--namespace", self.release.namespace, "--service", service]
        for ip, host in self.pods().items():
            argv += ["--pod", f"{ip}={host}"]
        return argv

    async def agent_shards(self) -> dict[int, AgentShard]:
        out: dict[int, AgentShard] = {}
        for p in self.procs:
            _say(p, "shards")
        for p in self.procs:
            for word in (await _hear(p, 60.0))[2:]:
                shard, agents, live, lost, back_at = word.split(":")
                s = out.setdefault(int(shard), AgentShard())
                s.agents += int(agents)
                s.live += int(live)
                s.lost += int(lost)
                s.back_at = max(s.back_at, float(back_at))
        return out

    async def until_back(
        self, shards: set[int], since: float, before: dict[int, AgentShard]
    ) -> float:
        """Until every agent of ``shards`` connected again after ``since`` (each lost its
        stream and is connected now); returns when the last one was acknowledged."""
        deadline = time.monotonic() + BACK_MAX_S
        while True:
            now = await self.agent_shards()
            if all(
                now[s].live == now[s].agents
                and now[s].lost >= before[s].lost + now[s].agents
                and now[s].back_at > since
                for s in shards
            ):
                return max(now[s].back_at for s in shards)
            if time.monotonic() > deadline:
                raise RuntimeError(f"shards {sorted(shards)}' agents not back: {now}")
            await asyncio.sleep(0.5)

    async def others_reconnected(self, moved: set[int], before: dict[int, AgentShard]) -> float:
        """After :data:`QUIET_S`: streams of agents of shards not in ``moved`` that ended."""
        await asyncio.sleep(QUIET_S)
        now = await self.agent_shards()
        return float(sum(now[s].lost - before[s].lost for s in now if s not in moved))

    # -- the replicas' figures -----------------------------------------------------------------

    async def metric(self, replica: Replica, name: str) -> float:
        assert self.http is not None
        return _sum(await _metrics(self.http, replica.base), name)


def node_name(i: int) -> str:
    """As :func:`bench.bench_fleet_scale._populate` names node ``i``."""
    return f"gpu-node-{i:05d}"


def projection(
    owned: list[tuple[int, float, float]], spare_rss_mib: float, spare_cpu_pct: float
) -> dict[str, float]:
    """100,000 nodes from the measured replicas (pure): ``owned`` is each owner's (nodes of
    its shards, steady RSS MiB, steady CPU %); a replica's cost above a spare's grows with the
    nodes it owns, the highest per node of all owners is taken (none below a spare's: a small
    run's noise). Replicas: as many as keep
    each inside the one-process envelope, plus one spare (a lost one's shards are taken
    without pushing another past it); memory: every replica's base plus the nodes' cost."""
    mib_per_node = max(0.0, *((rss - spare_rss_mib) / n for n, rss, _ in owned if n))
    cpu_per_node = max(0.0, *((cpu - spare_cpu_pct) / n for n, _, cpu in owned if n))
    per_replica = float(ENVELOPE_NODES)
    if mib_per_node > 0:
        per_replica = min(per_replica, (ENVELOPE_RSS_MIB - spare_rss_mib) / mib_per_node)
    if cpu_per_node > 0:
        per_replica = min(per_replica, (ENVELOPE_CPU_PCT - spare_cpu_pct) / cpu_per_node)
    holding = max(1, math.ceil(PROJECTED_NODES / max(per_replica, 1.0)))
    nodes_each = PROJECTED_NODES / holding
    replicas = holding + 1
    return {
        "projected_100k_replicas": float(replicas),
        "projected_100k_nodes_per_replica": nodes_each,
        "projected_100k_replica_rss_mib": spare_rss_mib + mib_per_node * nodes_each,
        "projected_100k_replica_cpu_pct": spare_cpu_pct + cpu_per_node * nodes_each,
        "projected_100k_memory_gib": (replicas * spare_rss_mib + mib_per_node * PROJECTED_NODES)
        / 1024,
        "kib_per_node": 1024 * mib_per_node,
    }


async def measure(plan: Plan, out: dict[str, float], note: Callable[[str], None]) -> None:
    """One run of ``plan``; its figures into ``out`` as they are measured (what was measured
    before a failure stays there)."""
    from gpuhealth.controller.kube.client import make_api_client
    from localkube import ControlPlane

    _raise_nofile()  # the controllers inherit it
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        workdir = Path(tmp)
        try:
            async with ControlPlane() as cp:
                admin = await make_api_client(str(cp.kubeconfig))
                try:
                    helpers: Any = importlib.import_module("tests.integration.controller_helpers")
                    kube = helpers.Cluster(cp, admin)
                    kube.chart_values = {
                        "shards": {"count": plan.shards},
                        "controller": {"replicas": plan.replicas},
                    }
                    async with AsyncExitStack() as stack:
                        fleet = Fleet(plan, kube, workdir, stack)
                        await _phases(fleet, str(cp.kubeconfig), out, note)
                finally:
                    await admin.close()
        except BaseException:
            for log in sorted(workdir.glob("*.log")):
                print(f"bench: {log.name} tail:\n{_tail(log)}", file=sys.stderr)
            raise
        finally:
            if KEEP_LOGS:
                Path(KEEP_LOGS).mkdir(parents=True, exist_ok=True)
                for log in workdir.glob("*.log"):
                    shutil.copy(log, Path(KEEP_LOGS) / f"shards-{plan.nodes}-{log.name}")


async def _phases(
    fleet: Fleet, kubeconfig: str, out: dict[str, float], note: Callable[[str], None]
) -> None:
    from gpuhealth.controller.names import Keys
    from localkube.process import free_port

    plan, kube, stack = fleet.plan, fleet.kube, fleet.stack
    route: Any = importlib.import_module("tests.integration.leader_route")
    takeover: Any = importlib.import_module("tests.integration.test_incident_takeover")
    service = await fleet.services()
    keys = Keys(str(fleet.release.config["prefix"]))
    t0 = time.monotonic()
    files = await _populate(
        kube,
        plan.nodes,
        fleet.workdir,
        workers=plan.workers,
        labels=lambda name: {keys.shard_label: str(shard_of(name, plan.shards))},
    )
    note(
        f"{plan.nodes} nodes (shards {fleet.sizes}), pods, tokens in {time.monotonic() - t0:.0f} s"
    )
    fleet.http = await stack.enter_async_context(aiohttp.ClientSession())
    fleet.endpoints = await stack.enter_async_context(
        route.ShardEndpoints(
            kube.api, fleet.release.namespace, service, fleet.pods(), plan.shards
        ).following()
    )
    fleet.port = free_port()
    for i in range(plan.replicas):
        await fleet.start_replica(i, service)
    owners = await fleet.until_owned(120.0)
    note(f"{plan.replicas} replicas; owners by shard {[o.name for o in owners]}")

    # -- cold start ----------------------------------------------------------------------------
    fleet.procs = stack.enter_context(
        _workers("", files, fleet.workdir / "agents.log", fleet.route(service, kubeconfig))
    )
    await asyncio.sleep(3.0)  # the workers read their tokens and the slices
    r = _Round(plan.nodes)
    rss_before = {x.index: _proc_rss_mib(x.proc.pid) for x in fleet.live()}
    await _connect_all(fleet.procs, [x.proc.pid for x in fleet.live()], r)
    out.update(r.out)
    note(
        f"all {plan.nodes} connected in {out['connect_all_s']:.1f} s ({out['attempts']:.0f} "
        f"attempts, {out['come_backs']:.0f} come-backs, {out['failures']:.0f} failures; the "
        f"replicas {out['connect_cpu_pct']:.0f} % of a core together, the agents' processes "
        f"{out['connect_agents_cpu_pct']:.0f} %)"
    )
    owners = await fleet.until_owned(30.0)
    expected = {x.index: 0 for x in fleet.live()}
    for shard, owner in enumerate(owners):
        expected[owner.index] += fleet.sizes[shard]
    assert fleet.http is not None
    http = fleet.http
    settled = await asyncio.gather(
        *(_settle(http, fleet.replicas[i].base, n) for i, n in expected.items() if n)
    )
    out["settle_s"] = max(settled)
    connected = {
        x.index: await fleet.metric(x, "gpuhealth_controller_connected_agents")
        for x in fleet.live()
    }
    out["misplaced_agents"] = sum(abs(connected[i] - n) for i, n in expected.items())
    note(f"settled in {out['settle_s']:.1f} s; agents per replica {connected}, owned {expected}")

    # -- steady --------------------------------------------------------------------------------
    m0 = {x.index: await _metrics(http, x.base) for x in fleet.live()}
    steady = await _steady(fleet, plan.steady_s)
    owned = [(expected[i], rss, cpu) for i, (cpu, rss, _beats) in steady.items()]
    out["steady_cpu_pct_max"] = max(cpu for cpu, _, _ in steady.values())
    out["steady_rss_mib_max"] = max(rss for _, rss, _ in steady.values())
    out["steady_rss_mib_total"] = sum(rss for _, rss, _ in steady.values())
    beats = sum(b for _, _, b in steady.values())
    cpu_s = sum(cpu for cpu, _, _ in steady.values()) * plan.steady_s / 100
    out["cpu_ms_per_heartbeat"] = 1000 * cpu_s / beats if beats else float("nan")
    out["kib_per_agent_max"] = max(
        1024 * (steady[i][1] - rss_before[i]) / n for i, n in expected.items() if n
    )
    note(
        "steady: "
        + ", ".join(
            f"{fleet.replicas[i].name} {cpu:.1f} % {rss:.0f} MiB ({expected[i]} nodes)"
            for i, (cpu, rss, _) in steady.items()
        )
        + f"; {out['cpu_ms_per_heartbeat']:.3f} ms CPU per heartbeat"
    )

    # -- faults on every shard -----------------------------------------------------------------
    prefix = str(fleet.release.config["prefix"])
    faulted: list[str] = []
    times = []
    elsewhere = 0.0
    for shard in range(plan.shards):
        owner = owners[shard]
        mine = [
            i
            for i in range(0, plan.nodes, plan.workers)  # worker 0's agents
            if shard_of(node_name(i), plan.shards) == shard
        ][: plan.faults_per_shard]
        for number in mine:
            ops0 = {
                x.index: await fleet.metric(x, "gpuhealth_taint_operations_total")
                for x in fleet.live()
            }
            times.append(await _fault_to_taint_ms(kube, fleet.procs[0], number, prefix))
            faulted.append(node_name(number))
            for x in fleet.live():
                grew = await fleet.metric(x, "gpuhealth_taint_operations_total") - ops0[x.index]
                if x is not owner:
                    elsewhere += grew
            await asyncio.sleep(0.3)
    out["fault_to_taint_p50_ms"] = statistics.median(times)
    out["fault_to_taint_p99_ms"] = percentile(times, 99)
    out["fault_taints_elsewhere"] = elsewhere
    out["peak_rss_mib_max"] = max(_proc_hwm_mib(x.proc.pid) for x in fleet.live())
    m1 = {x.index: await _metrics(http, x.base) for x in fleet.live()}
    out["lease_renewals_missed"] = sum(_lease_missed(m0[i], m1[i]) for i in m1)
    note(
        f"{len(times)} faults on {plan.shards} shards: p50 {out['fault_to_taint_p50_ms']:.1f} ms,"
        f" p99 {out['fault_to_taint_p99_ms']:.1f} ms; taint writes by non-owners {elsewhere:.0f}"
    )
    rec, _cache = await stack.enter_async_context(takeover.recorder(kube.cp, set(faulted)))

    # -- the owner of shard 0 SIGKILLed ----------------------------------------------------------
    victim = owners[0]
    its = {s for s, o in enumerate(owners) if o is victim}
    before = await fleet.agent_shards()
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    back_at = await fleet.until_back(its, killed, before)
    out["kill_agents_back_s"] = back_at - killed
    out["kill_other_shards_reconnected"] = await fleet.others_reconnected(its, before)
    out["kill_shards_untaken"] = float(sum(1 for o in await fleet.owners() if o is None))
    note(
        f"{victim.name} (shards {sorted(its)}) SIGKILLed: its agents back in "
        f"{out['kill_agents_back_s']:.1f} s; other shards' streams ended "
        f"{out['kill_other_shards_reconnected']:.0f}; shards without an owner "
        f"{out['kill_shards_untaken']:.0f}"
    )

    # -- a replica added -------------------------------------------------------------------------
    holders0 = await fleet.holders()
    before = await fleet.agent_shards()
    added = await fleet.start_replica(plan.replicas, service)
    cpu0, t_add = _proc_cpu_s(added.proc.pid), time.monotonic()
    await asyncio.sleep(plan.add_watch_s)
    out["spare_cpu_pct"] = 100 * (_proc_cpu_s(added.proc.pid) - cpu0) / (time.monotonic() - t_add)
    out["spare_rss_mib"] = _proc_rss_mib(added.proc.pid)
    holders1 = await fleet.holders()
    out["add_shards_moved"] = float(sum(a != b for a, b in zip(holders0, holders1, strict=True)))
    now = await fleet.agent_shards()
    out["add_agents_reconnected"] = float(sum(now[s].lost - before[s].lost for s in now))
    note(
        f"{added.name} added: shards moved {out['add_shards_moved']:.0f}, streams ended "
        f"{out['add_agents_reconnected']:.0f}; it holds nothing: {out['spare_cpu_pct']:.1f} % "
        f"of a core, {out['spare_rss_mib']:.0f} MiB"
    )

    # -- a replica removed cleanly ---------------------------------------------------------------
    owners_now = await fleet.until_owned(60.0)
    counts = {x.index: sum(o is x for o in owners_now) for x in fleet.live() if x is not added}
    leaving = fleet.replicas[max(counts, key=lambda i: counts[i])]
    its = {s for s, o in enumerate(owners_now) if o is leaving}
    before = await fleet.agent_shards()
    leaving.proc.send_signal(signal.SIGTERM)
    removed = time.monotonic()
    back_at = await fleet.until_back(its, removed, before)
    out["remove_agents_back_s"] = back_at - removed
    out["remove_exit_code"] = float(await asyncio.to_thread(leaving.proc.wait, 60))
    out["remove_other_shards_reconnected"] = await fleet.others_reconnected(its, before)
    out["remove_shards_untaken"] = float(sum(1 for o in await fleet.owners() if o is None))
    out["hard_taints_lost"] = float(len(rec.losses()))
    out["faulted_untainted"] = float(
        sum(1 for n in faulted if not rec.has(n, (f"{prefix}/unhealthy", "NoSchedule")))
    )
    note(
        f"{leaving.name} (shards {sorted(its)}) removed (exit {out['remove_exit_code']:.0f}): "
        f"its agents back in {out['remove_agents_back_s']:.1f} s; other shards' streams ended "
        f"{out['remove_other_shards_reconnected']:.0f}; hard taints lost "
        f"{out['hard_taints_lost']:.0f}, faulted nodes untainted {out['faulted_untainted']:.0f}"
    )
    out.update(projection(owned, out["spare_rss_mib"], out["spare_cpu_pct"]))
    note(
        f"100,000 nodes: {out['projected_100k_replicas']:.0f} replicas of "
        f"{out['projected_100k_replica_rss_mib']:.0f} MiB, "
        f"{out['projected_100k_replica_cpu_pct']:.1f} % of a core, "
        f"{out['projected_100k_memory_gib']:.2f} GiB in all"
    )
    for x in fleet.live():
        x.proc.send_signal(signal.SIGTERM)
    for x in fleet.replicas.values():
        await asyncio.to_thread(x.proc.wait, 120)


async def _steady(fleet: Fleet, seconds: float) -> dict[int, tuple[float, float, float]]:
    """``seconds`` of nothing but real heartbeats: each live replica's (CPU % of one core, RSS
    MiB median of samples, heartbeats it counted)."""
    assert fleet.http is not None
    live = fleet.live()
    key = 'gpuhealth_stream_messages_total{type="heartbeat"}'
    m0 = {x.index: (await _metrics(fleet.http, x.base)).get(key, 0.0) for x in live}
    cpu0 = {x.index: _proc_cpu_s(x.proc.pid) for x in live}
    t0 = time.monotonic()
    rss: dict[int, list[float]] = {x.index: [] for x in live}
    while time.monotonic() - t0 < seconds:
        await asyncio.sleep(min(2.0, seconds / 3))
        for x in live:
            rss[x.index].append(_proc_rss_mib(x.proc.pid))
    elapsed = time.monotonic() - t0
    out = {}
    for x in live:
        beats = (await _metrics(fleet.http, x.base)).get(key, 0.0) - m0[x.index]
        cpu = 100 * (_proc_cpu_s(x.proc.pid) - cpu0[x.index]) / elapsed
        out[x.index] = (cpu, statistics.median(rss[x.index]), beats)
    return out


def _note_from(t0: float) -> Callable[[str], None]:
    def note(what: str) -> None:
        print(
            f"bench: {time.monotonic() - t0:6.1f} s  [shards] {what}", file=sys.stderr, flush=True
        )

    return note


async def _run() -> dict[str, float]:
    plan = Plan()
    out: dict[str, float] = {
        "nodes": float(plan.nodes),
        "count": float(plan.shards),
        "replicas": float(plan.replicas),
    }
    with _held(LOCK):
        try:
            await measure(plan, out, _note_from(time.monotonic()))
            out["completed"] = 1.0
        except Exception as exc:  # what was measured before it failed still counts
            print(f"bench: fleet_shards failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            out["completed"] = 0.0
    return {f"shards_{k}": v for k, v in out.items()}


def _targets() -> tuple[Target, ...]:
    rows: list[tuple[str, str, float, Literal["<=", ">="]]] = [
        ("completed", "", 1.0, ">="),
        ("nodes", "", 40_000.0, ">="),
        ("replicas", "", 3.0, ">="),
        ("connect_all_s", "s", 120.0, "<="),
        ("settle_s", "s", 300.0, "<="),
        ("misplaced_agents", "", 0.0, "<="),
        ("steady_cpu_pct_max", "% core", ENVELOPE_CPU_PCT, "<="),
        ("steady_rss_mib_max", "MiB", ENVELOPE_RSS_MIB, "<="),
        ("peak_rss_mib_max", "MiB", 1024.0, "<="),
        ("kib_per_agent_max", "KiB", 25.0, "<="),
        ("cpu_ms_per_heartbeat", "ms", 0.1, "<="),
        ("fault_to_taint_p50_ms", "ms", 100.0, "<="),
        ("fault_to_taint_p99_ms", "ms", 500.0, "<="),
        ("fault_taints_elsewhere", "", 0.0, "<="),
        ("lease_renewals_missed", "", 0.0, "<="),
        ("kill_agents_back_s", "s", BACK_S, "<="),
        ("kill_other_shards_reconnected", "", 0.0, "<="),
        ("kill_shards_untaken", "", 0.0, "<="),
        ("add_shards_moved", "", 0.0, "<="),
        ("add_agents_reconnected", "", 0.0, "<="),
        ("remove_agents_back_s", "s", BACK_S, "<="),
        ("remove_exit_code", "", 0.0, "<="),
        ("remove_other_shards_reconnected", "", 0.0, "<="),
        ("remove_shards_untaken", "", 0.0, "<="),
        ("hard_taints_lost", "", 0.0, "<="),
        ("faulted_untainted", "", 0.0, "<="),
        ("spare_rss_mib", "MiB", ENVELOPE_RSS_MIB, "<="),
        ("projected_100k_memory_gib", "GiB", 8.0, "<="),
        ("projected_100k_replica_rss_mib", "MiB", ENVELOPE_RSS_MIB, "<="),
        ("projected_100k_replica_cpu_pct", "% core", ENVELOPE_CPU_PCT, "<="),
        ("projected_100k_nodes_per_replica", "", float(ENVELOPE_NODES), "<="),
        ("projected_100k_replicas", "", 12.0, "<="),
    ]
    return tuple(Target(f"shards_{m}", unit, limit, d) for m, unit, limit, d in rows)


BENCHMARKS = [
    Benchmark(name="fleet_shards", targets=_targets(), run=_run, needs_kube=True, repeats=1),
]
