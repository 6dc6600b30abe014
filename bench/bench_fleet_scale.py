"""The whole controller at fleet scale: 5,000 nodes and the largest N the fd limit allows.

``fleet_scale``: as an operator would measure it before a rollout. Per round, a fresh
localkube control plane (etcd, kube-apiserver); the chart's controller identity and
configuration rendered by ``helm template`` (``tests/integration/chart_identity.py``: its
ServiceAccount, RBAC, ``controller.yaml``); N GPU Nodes, one agent pod of the release's agent
ServiceAccount bound to each and a TokenRequest bound to that pod (raw JSON requests,
``CREATE_CONCURRENCY`` in flight); the real ``gpuhealth-controller`` process (``python -m
gpuhealth.controller.cli``, ``tests/integration/controller_helpers.py`` ``controller_process``)
leading through its Lease, writing Nodes (no ``--dry-run``), with TokenReviews of the bound
tokens and the agent-pod watch; plain HTTP on 127.0.0.1 and remediation off (:data:`OVERRIDES`).
The N agents are ``WORKERS`` separate processes (:mod:`bench.fleet_scale_agents`), each driving
N / ``WORKERS`` WebSockets from their own source addresses and speaking the real protocol, and
sending what the real agent sends on a busy node (every GPU held by a pod): on their first
connection its start-up Events, a Snapshot with the pod's allocations, then a Heartbeat every
10 s with the current time, telemetry that drifts every time and the pod's usage of every GPU
(3,336 bytes; measured from the real agent, held to it by
``tests/integration/test_bench_stream_shape.py``).

Each round measures, for its N:

- ``connect_all_s``: every agent told to connect at the same moment (as after a failover or a
  restart); the time until the last one's Snapshot is acknowledged;
- the controller's ``settle_s`` after that (its Node writes for N new agents) and the agents'
  attempts, come-backs (admission pacing) and failures;
- steady state, windows of ``STEADY_S`` with nothing but heartbeats (every 10 s per agent),
  real-fixed-fixed-real (:data:`STEADY_SHAPES`: the agents switched between the real agent's
  Heartbeats and the ``fixed`` ones this benchmark sent before issue 43, which repeat the same
  telemetry with no usage; a Snapshot each at the switch, a heartbeat period and the controller
  settled before the next window): the controller's CPU (% of one core, from ``/proc``) and RSS
  (median of samples); CPU per heartbeat (all its CPU in that window over the heartbeats it
  counted); memory per agent (RSS now minus RSS just before the agents came, both with the N
  Nodes and pods cached, over N); the round's figures are the ``real`` windows' medians,
  ``fixed_*`` the fixed ones', ``real_to_fixed_cpu`` the ratio of their CPU per heartbeat
  (measured under the same load); the agents' processes' own CPU in the real windows
  (``agents_cpu_pct``, all together, % of one core; ``agents_cpu_ms_per_heartbeat``), so a
  reader sees the load side is not what limits; the 1-minute load average after the windows
  (``steady_load_1m``: above the machine's core count, the figures were measured on a machine
  busy with more than this benchmark);
- ``FAULTS`` single XID 79 faults, one at a time on distinct nodes: the time from the agent
  writing the Event to the Node watch showing its NoSchedule taint (p50, p99);
- ``GET /api/v1/overview`` and the whole ``GET /api/v1/fleet`` (gzip, as a browser asks),
  ``HTTP_SAMPLES`` each: p50 and the size on the wire;
- ``gpuhealth_controller_lease_errors_total`` and ``..._leadership_lost_total`` over the round:
  lease renewals missed;
- ``gpuhealth_controller_event_loop_lag_seconds`` over the round: how many times the event loop
  was held past 1 s (``loop_lag_over_1s``; also reported for the connect phase, with the times
  past 5 s); ``gpuhealth_controller_gc_seconds``: the full garbage collections (``gc_full``),
  their seconds (``gc_full_s``) and those over 1 s (``gc_full_over_1s``);
- ``peak_rss_mib``: the most memory the controller held in the round (VmHWM: the cold start,
  the requests above);
- ``shutdown_s``: SIGTERM with every agent connected until the process exited (exit code 0);
- the failover: :data:`INCIDENTS` GPUIncidents stored meanwhile (:func:`_seed_incidents`),
  then a successor controller on the same address (a new process, as after a failover or an
  upgrade: the Nodes already labelled): ``failover_takeover_s`` from its start until it leads
  and is ready (its caches synced, the breaker and the incidents adopted: issue 38),
  ``failover_incidents_adopted`` and ``failover_adoption_s`` (its own metrics); then every
  agent connecting to it at once: ``failover_connect_all_s`` (the target scenario of a cold
  start: the first connect above also writes the labels and condition of N new Nodes, once in
  a fleet's life), its attempts,
  come-backs and failures, ``failover_settle_s``, the event loop late by over 1 s and the
  lease renewals missed meanwhile.

Rounds alternate the sizes (:data:`ROUNDS`, default small then large; ``small,large,small``
brackets the large one) in one invocation, so a ratio of large to small compares runs made
under the same load of the shared machine. Each round is bounded (``CONNECT_TIMEOUT_S``,
``SETTLE_MAX_S``, the steady window, 20 faults, 20 reads): 5,000 nodes take 4-10 minutes on the
2-core reference machine, 19,000 about three times that, mostly making the objects and admitting
the agents. Sizes:
``GPUHEALTH_BENCH_SCALE_SMALL`` (5,000) and ``GPUHEALTH_BENCH_SCALE_N`` (default the largest N
the fd limit allows: the controller holds one socket per agent, :func:`largest_n`);
``GPUHEALTH_BENCH_SCALE_ROUNDS`` e.g. ``small,large`` or ``small``. A quick run:
``GPUHEALTH_BENCH_SCALE_SMALL=500 GPUHEALTH_BENCH_SCALE_N=1000 python -m bench -k fleet_scale``.
Not measured: TLS, a standby replica, remediation, the scheduler extender (``extender_process``).
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, cast

import aiohttp

from bench.bench_stream import _proc_cpu_s, _proc_rss_mib, _raise_nofile
from bench.fleet_scale_agents import HEARTBEAT_S, Shape
from bench.registry import Benchmark, Target
from bench.stats import percentile

SMALL = int(os.environ.get("GPUHEALTH_BENCH_SCALE_SMALL", "5000"))
FD_RESERVE = 1_000
"""File descriptors the controller needs besides its agents' sockets (API server connections,
watches, log, listeners, the bench's requests)."""


def largest_n() -> int:
    """The most agents one controller can hold under this machine's fd limit (the hard limit,
    to which the bench raises the soft one), in thousands, at most 20,000."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return 20_000
    return max(SMALL, min(20_000, (hard - FD_RESERVE) // 1000 * 1000))


LARGE = int(os.environ.get("GPUHEALTH_BENCH_SCALE_N", "0")) or largest_n()
ROUNDS = tuple(os.environ.get("GPUHEALTH_BENCH_SCALE_ROUNDS", "small,large").split(","))
WORKERS = int(os.environ.get("GPUHEALTH_BENCH_SCALE_WORKERS", "4"))
"""Agent processes; each drives N / WORKERS agents."""
CREATE_CONCURRENCY = 48
LOCK = os.environ.get("GPUHEALTH_BENCH_SCALE_LOCK", "")
"""A file to ``flock`` around each round (e.g. /tmp/gpuhealth-heavy.lock), not the whole run."""
KEEP_LOGS = os.environ.get("GPUHEALTH_BENCH_SCALE_LOGS", "")
"""A directory to copy each round's controller and agents' logs to."""
STEADY_S = 30.0
"""Three heartbeat periods."""
STEADY_SHAPES: tuple[Shape, ...] = cast(
    tuple[Shape, ...],
    tuple(os.environ.get("GPUHEALTH_BENCH_SCALE_STEADY", "real,fixed,fixed,real").split(",")),
)
"""The steady windows, in order, by what the agents send (:mod:`bench.fleet_scale_agents`):
``real`` as the real agent on a busy node, ``fixed`` as this benchmark's agents did before
issue 43; real-fixed-fixed-real, so that a drift of the machine's load over the round weighs
on both alike (``GPUHEALTH_BENCH_SCALE_STEADY=fixed,real``: two windows, a quicker round; the
last one ``real``, as the agents then fail over)."""
REAL_TO_FIXED = 2.0
"""Most the controller's CPU per real Heartbeat may be over a fixed one's: issue 43 measured
1.6x; more means per-heartbeat work that grows with what changes, which the fixed shape hides."""
AGENTS_CPU_PCT = 50.0
"""Most the agents' processes together may use, % of one core: the load side leaves the
controller the machine's other cores and does not set the pace."""
FAULTS = 20
FAULT_STEP_S = 120.0
"""Bound of each step of one fault (the watch opened, the agent's Event sent, the taint seen):
on the 2-core machine loaded to 9-12 by other work, 30 s was once not enough at 19,000."""
HTTP_SAMPLES = 10
CONNECT_TIMEOUT_S = 900.0
SETTLE_QUIET_S = 3.0
SETTLE_MAX_S = 300.0
INCIDENTS = int(os.environ.get("GPUHEALTH_BENCH_SCALE_INCIDENTS", "1000"))
"""GPUIncidents stored before the failover, for the successor to adopt before its first
reconcile (issue 38): a busy fleet's recent history. ``0``: none (a controller from before
the GPUIncidents)."""
OPEN_INCIDENTS = 50
"""Of :data:`INCIDENTS`, how many are open (``unwatched`` nodes whose agents are in fact
connected: the successor adopts them, marks the nodes missing, and closes them when it hears
from their agents); the rest closed ones."""
TAKEOVER_S = 30.0
"""Most a successor may take from its start to leading and ready (``/readyz``: its caches
synced, the breaker and the incidents adopted), its predecessor's Lease released."""
ADOPTION_S = 2.0
"""Most the successor's adoption of the GPUIncidents may take (its one LIST of
:data:`INCIDENTS` objects and restoring the deciders)."""
TOKEN_SECONDS = 3600
"""Bound tokens outlive the round (the apiserver's minimum is 10 minutes)."""
OVERRIDES: dict[str, Any] = {
    "tls_cert_file": None,
    "tls_key_file": None,
    "remediation": {"enabled": False},
}
"""On top of the chart's ``controller.yaml``: plain HTTP on 127.0.0.1 (the chart's certificate
is a Deployment argument) and no remediation loop (its orders need TLS). Logs at the chart's
level; Nodes are written."""


@dataclass
class _Round:
    n: int
    out: dict[str, float] = field(default_factory=dict)


_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)
_WANTED = (
    "gpuhealth_controller_connected_agents",
    "gpuhealth_controller_is_leader",
    "gpuhealth_controller_lease_errors_total",
    "gpuhealth_controller_leadership_lost_total",
    "gpuhealth_nodes",
    "gpuhealth_reconcile_total",
    "gpuhealth_taint_operations_total",
    "gpuhealth_stream_messages_total",
    "gpuhealth_stream_rejected_total",
    "gpuhealth_stream_deferred_total",
    "gpuhealth_stream_gone_total",
    "gpuhealth_stream_tokens_total",
    "gpuhealth_controller_event_loop_lag_seconds_bucket",
    "gpuhealth_controller_event_loop_lag_seconds_count",
    "gpuhealth_controller_gc_seconds_bucket",
    "gpuhealth_controller_gc_seconds_count",
    "gpuhealth_controller_gc_seconds_sum",
    "gpuhealth_incidents_adopted",
    "gpuhealth_incident_adoption_seconds",
)
_LAG = "gpuhealth_controller_event_loop_lag_seconds"
_GC = "gpuhealth_controller_gc_seconds"


def _full_collections(m0: dict[str, float], m1: dict[str, float]) -> tuple[float, float, float]:
    """Full garbage collections between two scrapes: how many, their seconds, and how many
    took over 1 s."""
    full = '{generation="2"}'
    over = '{generation="2",le="1.0"}'

    def at(m: dict[str, float]) -> tuple[float, float, float]:
        count = m.get(f"{_GC}_count{full}", 0.0)
        return count, m.get(f"{_GC}_sum{full}", 0.0), count - m.get(f"{_GC}_bucket{over}", 0.0)

    a, b = at(m0), at(m1)
    return b[0] - a[0], b[1] - a[1], b[2] - a[2]


def _tokens(m0: dict[str, float], m1: dict[str, float]) -> tuple[float, float]:
    """Agents' tokens verified by the controller itself, and sent to a TokenReview, between
    two scrapes."""
    prefix = "gpuhealth_stream_tokens_total{"

    def at(m: dict[str, float]) -> tuple[float, float]:
        local = m.get(prefix + 'how="local"}', 0.0)
        reviewed = sum(v for k, v in m.items() if k.startswith(prefix + 'how="review_'))
        return local, reviewed

    a, b = at(m0), at(m1)
    return b[0] - a[0], b[1] - a[1]


def _lease_missed(m0: dict[str, float], m1: dict[str, float]) -> float:
    """Lease renewals that failed, and leads lost, between two scrapes."""
    return sum(
        _sum(m1, k) - _sum(m0, k)
        for k in (
            "gpuhealth_controller_lease_errors_total",
            "gpuhealth_controller_leadership_lost_total",
        )
    )


async def _until_leading(http: aiohttp.ClientSession, base: str) -> None:
    while (await _metrics(http, base)).get("gpuhealth_controller_is_leader") != 1.0:
        await asyncio.sleep(0.5)


async def _until_ready(http: aiohttp.ClientSession, base: str) -> None:
    """Until ``/readyz`` answers 200: the leader's work started (the breaker and the
    incidents adopted, the first reconcile under way)."""
    while True:
        async with http.get(f"{base}/readyz") as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.1)


def _lags_over(m0: dict[str, float], m1: dict[str, float], bound: str) -> float:
    """Loop-lag samples between two scrapes that were later than ``bound`` seconds (a bucket's
    ``le``: ``1.0``, ``5.0``)."""
    over = m1.get(f"{_LAG}_count", 0.0) - m1.get(f'{_LAG}_bucket{{le="{bound}"}}', 0.0)
    return over - (m0.get(f"{_LAG}_count", 0.0) - m0.get(f'{_LAG}_bucket{{le="{bound}"}}', 0.0))


async def _metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return {m[1] + (m[2] or ""): float(m[3]) for m in _SAMPLE.finditer(text) if m[1] in _WANTED}


def _sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


# -- the fleet's objects ---------------------------------------------------------------------


async def _populate(
    kube: Any,
    n: int,
    workdir: Path,
    *,
    workers: int = WORKERS,
    labels: Callable[[str], dict[str, str]] | None = None,
) -> list[Path]:
    """N Nodes (each with ``labels(name)``, as it registers), an agent pod on each and its
    bound token; the tokens in ``workers`` files (agent ``i`` in file ``i % workers``)."""
    from gpuhealth.controller.kube.rest import request
    from localkube.objects import gpu_node_body, pod_body

    release = await kube.release()
    sa, ns = release.agent_service_account, release.namespace
    audience = str(release.config["stream"]["audience"])
    api = kube.api
    tokens: dict[int, str] = {}

    async def one(i: int) -> None:
        name = f"gpu-node-{i:05d}"
        body = gpu_node_body(name, gpus=8, kwok=False, labels=labels(name) if labels else None)
        await request(api, "POST", "/api/v1/nodes", body=body)
        pod = await request(
            api,
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body=pod_body(f"agent-{name}", node_name=name, service_account=sa),
        )
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
        tokens[i] = (await request(api, "POST", path, body=body))["status"]["token"]

    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))
    files = []
    for w in range(workers):
        path = workdir / f"tokens-{w}"
        lines = [f"{i} gpu-node-{i:05d} {tokens[i]}\n" for i in range(w, n, workers)]
        path.write_text("".join(lines))
        files.append(path)
    return files


async def _seed_incidents(kube: Any, n: int) -> None:
    """:data:`INCIDENTS` GPUIncidents as a leader leaves them (object, then status, with the
    controller's identity: the chart's admission policy allows no other), about nodes spread
    over the fleet: :data:`OPEN_INCIDENTS` open ``unwatched`` ones, the rest closed."""
    from gpuhealth.controller.incidents.incident_store import PATH
    from gpuhealth.controller.incidents.model import Incident, Subjects
    from gpuhealth.controller.incidents.resource import new_object, status_object, status_of
    from gpuhealth.controller.incidents.unwatched import REASONS
    from gpuhealth.controller.kube.client import make_api_client
    from gpuhealth.controller.kube.rest import request
    from gpuhealth.controller.names import Keys

    release = await kube.release()
    keys = Keys(str(release.config["prefix"]))
    api = await make_api_client(str(release.kubeconfig))
    now = datetime.now(UTC)

    async def one(k: int) -> None:
        node = f"gpu-node-{k * n // INCIDENTS:05d}"
        closed = k >= OPEN_INCIDENTS
        incident = Incident(
            kind="unwatched",
            key=node,
            subjects=Subjects(nodes=(node,)),
            decision="condition AgentMissing",
            reason=REASONS["stopped-reporting"],
            opened_at=now - timedelta(hours=1),
            last_seen=now - timedelta(minutes=1),
            evidence={"gpus": 8},
            state="closed" if closed else "open",
            closed_at=now - timedelta(minutes=1) if closed else None,
            close_reason="its agent reports again" if closed else "",
        )
        created = await request(api, "POST", PATH, body=new_object(incident, keys))
        version = created["metadata"]["resourceVersion"]
        body = status_object(incident.id, version, status_of(incident))
        await request(api, "PUT", f"{PATH}/{incident.id}/status", body=body)

    queue = iter(range(INCIDENTS))

    async def worker() -> None:
        for k in queue:
            await one(k)

    try:
        await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))
    finally:
        await api.close()


# -- the agents' processes -------------------------------------------------------------------


@contextmanager
def _workers(
    base: str, files: list[Path], log: Path, route: Sequence[str] = ()
) -> Iterator[list[subprocess.Popen[str]]]:
    """The agents' processes, one per tokens file, speaking to ``base``; or, given ``route``
    (:mod:`bench.fleet_scale_agents`'s ``--shards ...`` arguments), each agent to its shard's
    owner, reconnecting by itself."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    where = (
        ["--reconnect", *route]
        if route
        else ["--url", base.replace("http", "ws", 1) + "/v1/stream"]
    )
    procs: list[subprocess.Popen[str]] = []
    with ExitStack() as stack:
        err = stack.enter_context(open(log, "ab"))
        try:
            for f in files:
                argv = [sys.executable, "-m", "bench.fleet_scale_agents", *where]
                argv += ["--heartbeat", "real"]
                procs.append(
                    subprocess.Popen(
                        [*argv, "--tokens", str(f)],
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                )
            yield procs
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                for pipe in (p.stdin, p.stdout):
                    if pipe is not None:
                        pipe.close()


def _say(p: subprocess.Popen[str], line: str) -> None:
    stdin: IO[str] | None = p.stdin
    assert stdin is not None
    stdin.write(line + "\n")
    stdin.flush()


async def _hear(p: subprocess.Popen[str], timeout_s: float) -> list[str]:
    assert p.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), timeout_s)
    if not line:
        raise RuntimeError(f"an agents' process ended (rc {p.poll()})")
    return line.split()


# -- one round -------------------------------------------------------------------------------


async def _connect_all(
    procs: list[subprocess.Popen[str]], ctl_pids: Sequence[int], r: _Round, phase: str = ""
) -> None:
    """Every agent told to connect at once; ``phase`` prefixes what is recorded. Also how
    busy the controllers (all of ``ctl_pids`` together) and the agents' processes were
    meanwhile (% of one core: which side set the pace), for the log."""
    go = time.monotonic()
    cpu0 = sum(_proc_cpu_s(pid) for pid in ctl_pids)
    agents0 = sum(_proc_cpu_s(p.pid) for p in procs)
    for p in procs:
        _say(p, "go")
    try:
        done = await asyncio.gather(*(_hear(p, CONNECT_TIMEOUT_S) for p in procs))
    except TimeoutError:
        r.out[f"{phase}connect_all_s"] = CONNECT_TIMEOUT_S  # at least: the round ends here
        raise
    seconds = time.monotonic() - go
    cpu = sum(_proc_cpu_s(pid) for pid in ctl_pids) - cpu0
    r.out[f"{phase}connect_cpu_pct"] = 100 * cpu / seconds
    agents = sum(_proc_cpu_s(p.pid) for p in procs) - agents0
    r.out[f"{phase}connect_agents_cpu_pct"] = 100 * agents / seconds
    r.out[f"{phase}connect_all_s"] = max(float(d[2]) for d in done) - go
    r.out[f"{phase}attempts"] = sum(float(d[3]) for d in done)
    r.out[f"{phase}come_backs"] = sum(float(d[4]) for d in done)
    r.out[f"{phase}failures"] = sum(float(d[5]) for d in done)


async def _settle(http: aiohttp.ClientSession, base: str, n: int) -> float:
    """Until every agent shows connected, no node unknown, and the reconcile and taint
    counters stood still for ``SETTLE_QUIET_S``; returns how long that took."""
    t0 = time.monotonic()
    last: dict[str, float] = {}
    still_since = t0
    while time.monotonic() - t0 < SETTLE_MAX_S:
        m = await _metrics(http, base)
        work = {k: v for k, v in m.items() if "reconcile" in k or "taint" in k}
        ready = m.get("gpuhealth_controller_connected_agents") == n and not m.get(
            'gpuhealth_nodes{state="unknown"}'
        )
        if work != last or not ready:
            last, still_since = work, time.monotonic()
        elif time.monotonic() - still_since >= SETTLE_QUIET_S:
            return still_since - t0
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the controller did not settle in {SETTLE_MAX_S:g} s: {last}")


@dataclass
class _Window:
    """One steady window: what the controller and the agents' processes spent in it."""

    shape: Shape
    seconds: float
    cpu_s: float
    rss_mib: float
    beats: float
    agents_cpu_s: float

    @property
    def cpu_ms_per_heartbeat(self) -> float:
        return 1000 * self.cpu_s / self.beats if self.beats else float("nan")


async def _window(
    http: aiohttp.ClientSession, base: str, pid: int, agent_pids: list[int], shape: Shape
) -> _Window:
    """``STEADY_S`` with nothing but heartbeats of ``shape``: CPU of the controller and of the
    agents' processes (``/proc``), the controller's RSS (median of samples), the heartbeats it
    counted."""
    m0, cpu0, t0 = await _metrics(http, base), _proc_cpu_s(pid), time.monotonic()
    agents0 = sum(_proc_cpu_s(p) for p in agent_pids)
    rss = []
    while time.monotonic() - t0 < STEADY_S:
        await asyncio.sleep(2.0)
        rss.append(_proc_rss_mib(pid))
    cpu, t1, m1 = _proc_cpu_s(pid), time.monotonic(), await _metrics(http, base)
    agents1 = sum(_proc_cpu_s(p) for p in agent_pids)
    key = 'gpuhealth_stream_messages_total{type="heartbeat"}'
    return _Window(
        shape=shape,
        seconds=t1 - t0,
        cpu_s=cpu - cpu0,
        rss_mib=statistics.median(rss),
        beats=m1.get(key, 0.0) - m0.get(key, 0.0),
        agents_cpu_s=agents1 - agents0,
    )


async def _reshape(
    http: aiohttp.ClientSession, base: str, procs: list[subprocess.Popen[str]], shape: Shape, n: int
) -> None:
    """Every agent speaks ``shape`` from now on (a Snapshot each: their pods came or went);
    then a heartbeat period, so that every agent's next Heartbeat is of that shape, and the
    controller settled."""
    for p in procs:
        _say(p, f"shape {shape}")
    for p in procs:
        await _hear(p, 120.0)
    await asyncio.sleep(HEARTBEAT_S)
    await _settle(http, base, n)


async def _steady(
    http: aiohttp.ClientSession,
    base: str,
    pid: int,
    procs: list[subprocess.Popen[str]],
    r: _Round,
) -> None:
    """The steady windows of :data:`STEADY_SHAPES`, switching the agents' shape between them;
    ``real`` windows give the round's steady figures, ``fixed`` ones the comparison, their
    ratio ``real_to_fixed_cpu`` (medians; both measured under the same load)."""
    windows: list[_Window] = []
    shape: Shape = "real"  # as the agents connected
    for want in STEADY_SHAPES:
        if want != shape:
            await _reshape(http, base, procs, want, r.n)
            shape = want
        windows.append(await _window(http, base, pid, [p.pid for p in procs], want))
    r.out["steady_load_1m"] = os.getloadavg()[0]
    for label, shape in (("", "real"), ("fixed_", "fixed")):
        mine = [w for w in windows if w.shape == shape]
        r.out[f"{label}steady_cpu_pct"] = statistics.median(100 * w.cpu_s / w.seconds for w in mine)
        r.out[f"{label}cpu_ms_per_heartbeat"] = statistics.median(
            w.cpu_ms_per_heartbeat for w in mine
        )
    real = [w for w in windows if w.shape == "real"]
    r.out["steady_rss_mib"] = statistics.median(w.rss_mib for w in real)
    r.out["heartbeats_per_s"] = statistics.median(w.beats / w.seconds for w in real)
    r.out["real_to_fixed_cpu"] = r.out["cpu_ms_per_heartbeat"] / r.out["fixed_cpu_ms_per_heartbeat"]
    r.out["agents_cpu_pct"] = statistics.median(100 * w.agents_cpu_s / w.seconds for w in real)
    r.out["agents_cpu_ms_per_heartbeat"] = statistics.median(
        1000 * w.agents_cpu_s / w.beats if w.beats else float("nan") for w in real
    )


def _our_taint(node: dict[str, Any], prefix: str) -> bool:
    taints = node.get("spec", {}).get("taints") or []
    return any(t["key"].startswith(prefix + "/") and t["effect"] == "NoSchedule" for t in taints)


async def _tainted_at(kube: Any, name: str, prefix: str, opened: asyncio.Event) -> float:
    """Monotonic time the Node watch showed ``name`` with our NoSchedule taint. A watch that
    ends first (expired, an ERROR event) is opened again from a fresh GET; if that GET shows
    the taint already, its answer's time is taken (a later bound)."""
    from gpuhealth.controller.kube.rest import open_request, request

    while True:
        node = await request(kube.api, "GET", f"/api/v1/nodes/{name}")
        if _our_taint(node, prefix):
            return time.monotonic()
        query = [
            ("watch", "true"),
            ("fieldSelector", f"metadata.name={name}"),
            ("resourceVersion", str(node["metadata"]["resourceVersion"])),
            ("timeoutSeconds", "60"),
        ]
        resp = await open_request(kube.api, "GET", "/api/v1/nodes", query=query, timeout_s=90)
        opened.set()
        try:
            async for line in resp.content:
                ev = json.loads(line)
                if ev.get("type") in ("ADDED", "MODIFIED") and _our_taint(ev["object"], prefix):
                    return time.monotonic()
        finally:
            resp.release()


async def _fault_to_taint_ms(
    kube: Any, proc: subprocess.Popen[str], number: int, prefix: str
) -> float:
    """Agent ``number`` (one of ``proc``'s) sends an XID 79; milliseconds from its send until
    the Node watch shows its NoSchedule taint."""
    opened = asyncio.Event()
    seen = asyncio.create_task(_tainted_at(kube, f"gpu-node-{number:05d}", prefix, opened))
    await asyncio.wait_for(opened.wait(), FAULT_STEP_S)
    await asyncio.sleep(0.1)  # the watch is registered
    _say(proc, f"fault {number}")
    sent = await _hear(proc, FAULT_STEP_S)
    tainted = await asyncio.wait_for(seen, FAULT_STEP_S)
    return 1000 * (tainted - float(sent[2]))


async def _faults(kube: Any, procs: list[subprocess.Popen[str]], r: _Round) -> None:
    release = await kube.release()
    prefix = str(release.config["prefix"])
    times = []
    for k in range(FAULTS):
        number = k * r.n // FAULTS // WORKERS * WORKERS  # spread over the fleet; worker 0's
        times.append(await _fault_to_taint_ms(kube, procs[0], number, prefix))
        await asyncio.sleep(0.3)
    r.out["fault_to_taint_p50_ms"] = statistics.median(times)
    r.out["fault_to_taint_p99_ms"] = percentile(times, 99)


async def _gets(http: aiohttp.ClientSession, base: str, r: _Round) -> None:
    for name, path in (("overview", "/api/v1/overview"), ("fleet", "/api/v1/fleet")):
        times, size = [], 0
        for _ in range(HTTP_SAMPLES):
            t0 = time.monotonic()
            async with http.get(
                f"{base}{path}", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"GET {path}: {resp.status}")
            times.append(1000 * (time.monotonic() - t0))
            size = len(body)
        r.out[f"{name}_p50_ms"] = statistics.median(times)
        r.out[f"{name}_kb"] = size / 1000


async def _round(r: _Round, t0: float) -> None:
    from gpuhealth.controller.kube.client import make_api_client
    from localkube import ControlPlane

    def note(what: str) -> None:
        print(f"bench: {time.monotonic() - t0:6.1f} s  [{n}] {what}", file=sys.stderr, flush=True)

    helpers: Any = importlib.import_module("tests.integration.controller_helpers")
    n = r.n
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        try:
            async with ControlPlane() as cp:
                admin = await make_api_client(str(cp.kubeconfig))
                try:
                    kube = helpers.Cluster(cp, admin)
                    await kube.release()
                    c0 = time.monotonic()
                    files = await _populate(kube, n, workdir)
                    note(f"{n} nodes, agent pods and tokens in {time.monotonic() - c0:.0f} s")
                    async with (
                        helpers.controller_process(kube, workdir, OVERRIDES) as (ctl, base),
                        aiohttp.ClientSession() as http,
                    ):
                        await _measure(kube, http, ctl, base, files, workdir, r, note)
                finally:
                    await admin.close()
        except BaseException:
            for log in ("controller.log", "controller-2.log", "agents.log"):
                print(f"bench: {log} tail:\n{_tail(workdir / log)}", file=sys.stderr)
            raise
        finally:
            if KEEP_LOGS:
                Path(KEEP_LOGS).mkdir(parents=True, exist_ok=True)
                for log in ("controller.log", "controller-2.log", "agents.log"):
                    if (workdir / log).exists():
                        shutil.copy(workdir / log, Path(KEEP_LOGS) / f"{n}-{int(t0)}-{log}")


async def _measure(
    kube: Any,
    http: aiohttp.ClientSession,
    ctl: subprocess.Popen[bytes],
    base: str,
    files: list[Path],
    workdir: Path,
    r: _Round,
    note: Any,
) -> None:
    n = r.n
    await _until_leading(http, base)
    with _workers(base, files, workdir / "agents.log") as procs:
        await asyncio.sleep(3.0)  # the workers read their tokens
        m0 = await _metrics(http, base)
        rss_before = _proc_rss_mib(ctl.pid)
        await _connect_all(procs, [ctl.pid], r)
        m_connected = await _metrics(http, base)
        r.out["connect_loop_lag_over_1s"] = _lags_over(m0, m_connected, "1.0")
        r.out["connect_loop_lag_over_5s"] = _lags_over(m0, m_connected, "5.0")
        r.out["tokens_local"], r.out["tokens_reviewed"] = _tokens(m0, m_connected)
        note(
            f"event loop late by over 1 s {r.out['connect_loop_lag_over_1s']:.0f} times, "
            f"over 5 s {r.out['connect_loop_lag_over_5s']:.0f} times while connecting; "
            f"tokens verified here {r.out['tokens_local']:.0f}, by TokenReview "
            f"{r.out['tokens_reviewed']:.0f}"
        )
        note(
            f"all {n} connected in {r.out['connect_all_s']:.1f} s ({r.out['attempts']:.0f} "
            f"attempts, {r.out['come_backs']:.0f} come-backs, {r.out['failures']:.0f} failures;"
            f" meanwhile the controller {r.out['connect_cpu_pct']:.0f} % of a core, the agents'"
            f" processes {r.out['connect_agents_cpu_pct']:.0f} %, load average "
            f"{os.getloadavg()[0]:.2f})"
        )
        r.out["settle_s"] = await _settle(http, base, n)
        note(f"settled after {r.out['settle_s']:.1f} s")
        await _steady(http, base, ctl.pid, procs, r)
        r.out["kib_per_agent"] = 1024 * (r.out["steady_rss_mib"] - rss_before) / n
        note(
            f"steady, real heartbeats: {r.out['steady_cpu_pct']:.1f} % CPU, "
            f"{r.out['steady_rss_mib']:.0f} MiB ({r.out['kib_per_agent']:.1f} KiB/agent over "
            f"{rss_before:.0f}), {r.out['heartbeats_per_s']:.0f} heartbeats/s, "
            f"{r.out['cpu_ms_per_heartbeat']:.3f} ms CPU each; fixed heartbeats: "
            f"{r.out['fixed_steady_cpu_pct']:.1f} % CPU, {r.out['fixed_cpu_ms_per_heartbeat']:.3f}"
            f" ms each (real / fixed {r.out['real_to_fixed_cpu']:.2f}); the agents' processes: "
            f"{r.out['agents_cpu_pct']:.1f} % of a core, {r.out['agents_cpu_ms_per_heartbeat']:.3f}"
            f" ms per heartbeat; load average {r.out['steady_load_1m']:.2f}"
        )
        await _faults(kube, procs, r)
        note(
            f"fault->taint p50 {r.out['fault_to_taint_p50_ms']:.1f} ms, "
            f"p99 {r.out['fault_to_taint_p99_ms']:.1f} ms"
        )
        await _gets(http, base, r)
        note(
            f"overview {r.out['overview_p50_ms']:.1f} ms {r.out['overview_kb']:.0f} kB, "
            f"fleet {r.out['fleet_p50_ms']:.1f} ms {r.out['fleet_kb']:.0f} kB (gzip)"
        )
        m1 = await _metrics(http, base)
        for p in procs:
            _say(p, "lost")
        lost = sum([float((await _hear(p, 30.0))[1]) for p in procs])
        missed = _lease_missed(m0, m1)
        r.out["lease_renewals_missed"] = missed
        r.out["loop_lag_over_1s"] = _lags_over(m0, m1, "1.0")
        full = _full_collections(m0, m1)
        r.out["gc_full"], r.out["gc_full_s"], r.out["gc_full_over_1s"] = full
        r.out["peak_rss_mib"] = _proc_hwm_mib(ctl.pid)
        r.out["streams_lost"] = lost
        t_term = time.monotonic()
        ctl.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(ctl.wait, 120)
        r.out["shutdown_s"] = time.monotonic() - t_term
        note(
            f"lease renewals missed {missed:.0f}, event loop late by over 1 s "
            f"{r.out['loop_lag_over_1s']:.0f} times ({full[0]:.0f} full collections: "
            f"{full[1]:.1f} s, {full[2]:.0f} over 1 s), streams lost {lost:.0f}; "
            f"SIGTERM -> exit {r.out['shutdown_s']:.1f} s (rc {rc})"
        )
        if rc != 0:
            raise RuntimeError(f"the controller exited {rc} on SIGTERM")
        await _failover(kube, http, base, procs, workdir, r, note)


async def _failover(
    kube: Any,
    http: aiohttp.ClientSession,
    base: str,
    procs: list[subprocess.Popen[str]],
    workdir: Path,
    r: _Round,
    note: Any,
) -> None:
    """A successor controller on the same address (its Nodes labelled, their conditions
    written by its predecessor), every agent connecting to it at once: the cold start of a
    failover or an upgrade, which the first connect of fresh Nodes overstates by their
    first writes."""
    helpers: Any = importlib.import_module("tests.integration.controller_helpers")
    port = int(base.rsplit(":", 1)[1])
    if INCIDENTS:
        await _seed_incidents(kube, r.n)
    spawned = time.monotonic()
    async with helpers.controller_process(
        kube, workdir, OVERRIDES, port=port, log_name="controller-2.log"
    ) as (ctl, base2):
        await _until_leading(http, base2)
        await _until_ready(http, base2)
        r.out["failover_takeover_s"] = time.monotonic() - spawned
        m0 = await _metrics(http, base2)
        r.out["failover_incidents_adopted"] = m0.get("gpuhealth_incidents_adopted", 0.0)
        r.out["failover_adoption_s"] = m0.get("gpuhealth_incident_adoption_seconds", 0.0)
        note(
            f"failover: a successor started, leading and ready in "
            f"{r.out['failover_takeover_s']:.1f} s, {r.out['failover_incidents_adopted']:.0f} "
            f"incidents adopted in {1000 * r.out['failover_adoption_s']:.0f} ms"
        )
        await _connect_all(procs, [ctl.pid], r, "failover_")
        r.out["failover_settle_s"] = await _settle(http, base2, r.n)
        m1 = await _metrics(http, base2)
        r.out["failover_loop_lag_over_1s"] = _lags_over(m0, m1, "1.0")
        r.out["failover_lease_renewals_missed"] = _lease_missed(m0, m1)
        r.out["failover_tokens_local"], r.out["failover_tokens_reviewed"] = _tokens(m0, m1)
        note(
            f"failover: all {r.n} connected to a successor in "
            f"{r.out['failover_connect_all_s']:.1f} s ({r.out['failover_attempts']:.0f} attempts, "
            f"{r.out['failover_come_backs']:.0f} come-backs, {r.out['failover_failures']:.0f} "
            f"failures; the controller {r.out['failover_connect_cpu_pct']:.0f} % of a core, the "
            f"agents' processes {r.out['failover_connect_agents_cpu_pct']:.0f} %), settled "
            f"after {r.out['failover_settle_s']:.1f} s, event loop late by over 1 s "
            f"{r.out['failover_loop_lag_over_1s']:.0f} times, lease renewals missed "
            f"{r.out['failover_lease_renewals_missed']:.0f}; tokens verified here "
            f"{r.out['failover_tokens_local']:.0f}, by TokenReview "
            f"{r.out['failover_tokens_reviewed']:.0f}"
        )
        ctl.send_signal(signal.SIGTERM)
        await asyncio.to_thread(ctl.wait, 120)


def _proc_hwm_mib(pid: int) -> float:
    """The process's peak RSS so far (VmHWM): the cold start's and the requests' peaks."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


@contextmanager
def _held(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for one round (none when empty): on a shared
    machine, other heavy work may run between rounds, not during one."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _run() -> dict[str, list[float]]:
    _raise_nofile()  # the controller inherits it
    sizes = {"small": SMALL, "large": LARGE}
    t0 = time.monotonic()
    rounds = []
    for k in ROUNDS:
        with _held(LOCK):
            r = _Round(sizes[k])
            rounds.append(r)
            try:
                await _round(r, t0)
                r.out["completed"] = 1.0
            except Exception as exc:  # what the round measured before it failed still counts
                print(f"bench: round of {r.n} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                r.out["completed"] = 0.0
    out: dict[str, list[float]] = {}
    for r in rounds:
        label = "small" if r.n == SMALL else "large"
        for k, v in r.out.items():
            out.setdefault(f"scale_{label}_{k}", []).append(v)
    small = [r for r in rounds if r.n == SMALL]
    large = [r for r in rounds if r.n == LARGE and LARGE != SMALL]
    if small and large and all("steady_rss_mib" in x.out for x in small + large):
        for k in ("steady_cpu_pct", "steady_rss_mib", "connect_all_s"):
            ratio = statistics.median(x.out[k] for x in large) / statistics.median(
                x.out[k] for x in small
            )
            out.setdefault(f"scale_growth_{k}", []).append(ratio)
    print(f"bench: fleet_scale sizes small={SMALL} large={LARGE}", file=sys.stderr)
    return out


def _targets() -> tuple[Target, ...]:
    rows: list[Target] = []
    for label in ("small", "large"):
        rows += [
            Target(f"scale_{label}_completed", "", 1.0, ">="),
            Target(f"scale_{label}_connect_all_s", "s", 120.0, "<="),
            Target(f"scale_{label}_failover_connect_all_s", "s", 120.0, "<="),
            Target(f"scale_{label}_failover_lease_renewals_missed", "", 0.0, "<="),
            Target(f"scale_{label}_failover_takeover_s", "s", TAKEOVER_S, "<="),
            Target(f"scale_{label}_failover_adoption_s", "s", ADOPTION_S, "<="),
            Target(f"scale_{label}_failover_incidents_adopted", "", float(INCIDENTS), ">="),
            Target(f"scale_{label}_failover_settle_s", "s", SETTLE_MAX_S, "<="),
            Target(f"scale_{label}_steady_cpu_pct", "% core", 20.0, "<="),
            Target(f"scale_{label}_steady_rss_mib", "MiB", 768.0, "<="),
            Target(f"scale_{label}_peak_rss_mib", "MiB", 1024.0, "<="),
            Target(f"scale_{label}_kib_per_agent", "KiB", 25.0, "<="),
            Target(f"scale_{label}_cpu_ms_per_heartbeat", "ms", 0.1, "<="),
            Target(f"scale_{label}_fixed_cpu_ms_per_heartbeat", "ms", 0.1, "<="),
            Target(f"scale_{label}_real_to_fixed_cpu", "x", REAL_TO_FIXED, "<="),
            Target(f"scale_{label}_agents_cpu_pct", "% core", AGENTS_CPU_PCT, "<="),
            Target(f"scale_{label}_agents_cpu_ms_per_heartbeat", "ms", 0.25, "<="),
            Target(f"scale_{label}_steady_load_1m", "", float(os.cpu_count() or 1), "<="),
            Target(f"scale_{label}_fault_to_taint_p50_ms", "ms", 100.0, "<="),
            Target(f"scale_{label}_fault_to_taint_p99_ms", "ms", 500.0, "<="),
            Target(f"scale_{label}_overview_p50_ms", "ms", 100.0, "<="),
            Target(f"scale_{label}_fleet_p50_ms", "ms", 2000.0, "<="),
            Target(f"scale_{label}_lease_renewals_missed", "", 0.0, "<="),
            Target(f"scale_{label}_loop_lag_over_1s", "", 0.0, "<="),
            Target(f"scale_{label}_streams_lost", "", 0.0, "<="),
            Target(f"scale_{label}_shutdown_s", "s", 25.0, "<="),
        ]
    for k in ("steady_cpu_pct", "steady_rss_mib"):
        # no worse than linear in the node count
        rows.append(Target(f"scale_growth_{k}", "x", LARGE / SMALL, "<="))
    return tuple(rows)


BENCHMARKS = [
    Benchmark(
        name="fleet_scale",
        targets=_targets(),
        run=_run,
        needs_kube=True,
        repeats=1,
    ),
]
