"""Scheduler extender latency through the real controller process, 100 and 5,000 nodes.

``extender_process``: localkube's kube-apiserver and etcd; the chart's controller identity
and configuration rendered by ``helm template`` (``tests/integration/chart_identity.py``:
its ServiceAccount, RBAC and ``controller.yaml``); the real ``gpuhealth-controller`` process
(``python -m gpuhealth.controller.cli``, ``tests/integration/controller_helpers.py``
``controller_process``) serving plain HTTP on 127.0.0.1 with all its middleware (slow-client
guard, body limits, access control), ``--dry-run`` and remediation off (:data:`OVERRIDES`).
Its fleet is filled the production way: for every node a Node, an agent pod of the release's
agent ServiceAccount bound to it and a TokenRequest bound to that pod (32 API calls in
flight); each token goes at once to a separate process (``python -m
bench.bench_extender_process agents``, on its stdin), which opens that node's WebSocket to
``/v1/stream`` with it (TokenReview, agent-pod check; 24 at a time, returning when told to
come back, as the agent does), sends Hello and a Snapshot of 8 GPUs
(``bench_placement.node_report``: about 1 % unhealthy, 2 % degraded, temperature, ECC and
bandwidth telemetry, some allocated), waits for both Acks and stays connected, with a
Heartbeat (the same telemetry, the allocations' usage) every 10 s at a random phase, as the
agent does by default.

First 100 nodes, then 4,900 more (same control plane, same controller, the first agents still
connected). Once ``/metrics`` shows every agent connected and no node without a Snapshot, and
the reconcile and taint counters have been still for 2 s, an aiohttp client POSTs ExtenderArgs
of a 4-GPU pod with all N ``NodeNames`` (nodeCacheCapable) to ``/scheduler/filter`` and
``/scheduler/prioritize``: ``REQUESTS`` requests per verb after ``WARMUP``, each followed by
the same request to the in-process extender (``bench_placement.serve_extender``, as
``extender_5000_nodes`` measures it: ``extender_app`` on 127.0.0.1 in this process over a
Fleet fed the same Hello and Snapshot messages), so both see the same load. The first answers
of the two must be identical. Per round and N:

- ``extender_process_<verb>_p50_ms_<N>`` / ``_p99_ms_<N>``: through the controller process;
- ``extender_inprocess_<verb>_p50_ms_<N>`` / ``_p99_ms_<N>``: in-process, same round;
- ``extender_process_<verb>_vs_inprocess_<N>``: the ratio of the two p50s: what the process
  path (its middleware, the 500 heartbeats/s it ingests at 5,000 nodes, its other work)
  costs on top, whatever the machine's load.

``ROUNDS`` rounds per N. After each N the bench notes on stderr how busy the controller was
and its own view of the same calls (``gpuhealth_extender_duration_seconds``: decode, decide,
encode), which tells time in the handler from time around it (HTTP, middleware, waiting for
its event loop). 4 to 5.5 minutes on the 2-core reference machine under other work (load
average 5-9), mostly making the 15,000 objects and admitting the 5,000 agents (tokens expire
after 10 minutes). Not measured: TLS (the chart serves TLS by default; this controller is
plain HTTP, as the integration tests run it), a standby replica, Node writes (``--dry-run``),
and kube-scheduler's own side of the call.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.bench_placement import (
    extender_body,
    fleet_of,
    hello_of,
    node_name,
    node_report,
    serve_extender,
    snapshot_of,
    timed_post,
)
from bench.bench_remediation_kube import _limited
from bench.bench_stream import _proc_cpu_s, _raise_nofile
from bench.registry import Benchmark, Target
from bench.stats import percentile
from gpuhealth.protocol import Allocation, AllocationUsage, GpuStatus, Heartbeat

NODE_COUNTS = (100, 5000)
VERBS = ("filter", "prioritize")
ROUNDS = 3
REQUESTS = 200
"""Requests per verb, round and N (each followed by the same request in-process)."""
WARMUP = 20
HEARTBEAT_S = 10.0
"""The agent's default heartbeat interval (``fleet.agent_timeout_s`` is 60 s)."""
CONNECT_CONCURRENCY = 24
"""WebSockets the agents' process opens at once: below the controller's
``http.max_pending_per_client`` (32) for one address and about its
``stream.auth_max_concurrent_reviews`` (32)."""
READY_TIMEOUT_S = 300.0
SETTLE_QUIET_S = 2.0
SETTLE_MAX_S = 60.0
OVERRIDES: dict[str, Any] = {
    "log_level": "warning",
    "tls_cert_file": None,
    "tls_key_file": None,
    "remediation": {"enabled": False},
    "dry_run": True,
}
"""On top of the chart's ``controller.yaml``: plain HTTP on 127.0.0.1 (the chart's TLS
certificate is a Deployment argument, not part of that file), no remediation loop (its orders
would need TLS), warnings only, and ``dry_run``: the controller decides every node's labels,
condition and taints but writes none of them. The extender reads only the fleet, and is
measured once the controller has settled; without it admitting 5,000 agents also costs
10,000-odd Node writes and their watch events, which doubled the setup (over 8 minutes on the
loaded reference machine) and measure nothing here."""
AT = datetime(2026, 11, 22, 10, tzinfo=UTC)


def _report(n: int) -> tuple[list[GpuStatus], list[Allocation]]:
    """Node ``n``'s GPUs and allocations, the same in the agents' process and in-process."""
    return node_report(n, random.Random(n))


def _heartbeat(n: int, seq: int, gpus: list[GpuStatus], allocs: list[Allocation]) -> bytes:
    from gpuhealth.protocol import encode

    return encode(
        Heartbeat(
            seq=seq,
            node=node_name(n),
            at=AT,
            usage=[
                AllocationUsage(
                    namespace=a.namespace,
                    pod=a.pod,
                    container=a.container,
                    gpu_uuid=a.gpu_uuid,
                    utilization_ratio=0.9,
                    samples=10,
                )
                for a in allocs
            ],
            telemetry=[g.telemetry for g in gpus if g.telemetry is not None],
        )
    )


# -- the agents' process -------------------------------------------------------------------


class _ComeBack(Exception):
    """Error(rate-limited, retry_after_s): the controller asks the agent to return later."""

    def __init__(self, after_s: float) -> None:
        super().__init__(after_s)
        self.after_s = after_s


async def _agents(url: str) -> None:
    """One stream per line ``<node> <bound token>`` read from stdin, opened as the line
    arrives: Hello, Snapshot, both acked, then heartbeats until terminated. Prints ``ready:
    ...`` once stdin is closed and every agent is in."""
    from gpuhealth.protocol import Ack, Error, encode
    from gpuhealth.protocol.codec import decode_controller

    _raise_nofile()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        sem = asyncio.Semaphore(CONNECT_CONCURRENCY)
        tasks: list[asyncio.Task[None]] = []

        async def acked(ws: aiohttp.ClientWebSocketResponse, frame: bytes, seq: int) -> None:
            await ws.send_bytes(frame)
            msg = await ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.BINARY:
                raise RuntimeError(f"stream closed: {msg.type} {msg.data!r}")
            reply = decode_controller(msg.data)
            if isinstance(reply, Error) and reply.retry_after_s is not None:
                raise _ComeBack(reply.retry_after_s)
            if not isinstance(reply, Ack) or reply.seq < seq:
                raise RuntimeError(f"expected Ack {seq}, got {reply!r}")

        async def beat(n: int, ws: aiohttp.ClientWebSocketResponse) -> None:
            gpus, allocs = _report(n)
            await asyncio.sleep(random.uniform(0, HEARTBEAT_S))
            seq = 2
            while True:
                seq += 1
                await ws.send_bytes(_heartbeat(n, seq, gpus, allocs))
                await asyncio.sleep(HEARTBEAT_S)

        async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
            async for _ in ws:  # acks
                pass

        async def connect(name: str, token: str) -> None:
            n = int(name.rsplit("-", 1)[1])
            gpus, allocs = _report(n)
            while True:
                try:
                    async with sem:
                        ws = await http.ws_connect(
                            url, headers={"Authorization": f"Bearer {token}"}, heartbeat=None
                        )
                        try:
                            await acked(ws, encode(hello_of(n, gpus)), 0)
                            await acked(ws, encode(snapshot_of(n, gpus, allocs)), 2)
                        except BaseException:
                            await ws.close()
                            raise
                    break
                except _ComeBack as later:  # the controller paces admissions, as for the agent
                    await asyncio.sleep(later.after_s * random.uniform(1.0, 1.2))
            # From now on, as the agent does: read (pongs), heartbeat.
            tasks.append(asyncio.create_task(read(ws)))
            tasks.append(asyncio.create_task(beat(n, ws)))

        t0 = time.monotonic()
        stdin = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        connects = []
        while line := await stdin.readline():
            name, token = line.decode().split()
            connects.append(asyncio.create_task(connect(name, token)))
        await asyncio.gather(*connects)
        print(f"ready: {len(connects)} agents in {time.monotonic() - t0:.1f} s", flush=True)
        await asyncio.gather(*tasks)


# -- the benchmark -------------------------------------------------------------------------


@contextmanager
def _agents_process(base: str, log: Path) -> Iterator[subprocess.Popen[str]]:
    """The agents' process; write ``<node> <token>`` lines to its stdin, close it, read
    ``ready: ...`` from its stdout."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    url = base.replace("http://", "ws://") + "/v1/stream"
    argv = [sys.executable, "-m", "bench.bench_extender_process", "agents", "--url", url]
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


async def _populate(kube: Any, numbers: range, agents: subprocess.Popen[str]) -> None:
    """A Node, an agent pod bound to it and that pod's bound token per node number, each
    token handed to the agents' process at once (its agent connects while the next are
    made); then its stdin is closed."""
    from localkube.objects import create_pod, request_bound_token

    release = await kube.release()
    sa, ns = release.agent_service_account, release.namespace
    audience = str(release.config["stream"]["audience"])
    assert agents.stdin is not None
    stdin = agents.stdin

    async def one(name: str) -> None:
        # ChartRelease.agent, with a pod name per node (its random ones collide at 5,000)
        await kube.node(name, gpus=8)
        pod = await create_pod(kube.api, ns, f"agent-{name}", node_name=name, service_account=sa)
        token = await request_bound_token(kube.api, ns, sa, pod, audience)
        stdin.write(f"{name} {token}\n")
        stdin.flush()

    await _limited([node_name(n) for n in numbers], one)
    stdin.close()


_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


async def _metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The controller's metrics this bench looks at: ``name`` or ``name{labels}`` -> value."""
    wanted = (
        "gpuhealth_controller_connected_agents",
        "gpuhealth_nodes",
        "gpuhealth_reconcile_total",
        "gpuhealth_taint_operations_total",
        "gpuhealth_extender_duration_seconds_bucket",
        "gpuhealth_extender_duration_seconds_count",
        "gpuhealth_extender_duration_seconds_sum",
    )
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return {m[1] + (m[2] or ""): float(m[3]) for m in _SAMPLE.finditer(text) if m[1] in wanted}


async def _until_reporting(
    http: aiohttp.ClientSession, base: str, n: int, agents: subprocess.Popen[str]
) -> None:
    assert agents.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(agents.stdout.readline), READY_TIMEOUT_S)
    if not line.startswith("ready:"):
        raise RuntimeError(f"the agents did not connect (rc {agents.poll()}): {line!r}")
    print(f"bench: {line.strip()}", file=sys.stderr)
    deadline = time.monotonic() + 30
    while True:
        m = await _metrics(http, base)
        nodes = sum(v for k, v in m.items() if k.startswith("gpuhealth_nodes{"))
        unknown = m.get('gpuhealth_nodes{state="unknown"}', 0.0)
        if m.get("gpuhealth_controller_connected_agents") == n and nodes == n and not unknown:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the controller does not show {n} reporting agents: {m}")
        await asyncio.sleep(0.5)


async def _settle(http: aiohttp.ClientSession, base: str) -> None:
    """Until the reconcile and taint counters stood still for ``SETTLE_QUIET_S``."""
    deadline = time.monotonic() + SETTLE_MAX_S
    last: dict[str, float] = {}
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        m = await _metrics(http, base)
        work = {k: v for k, v in m.items() if "reconcile" in k or "taint" in k}
        if work != last:
            last, still_since = work, time.monotonic()
        elif time.monotonic() - still_since >= SETTLE_QUIET_S:
            return
        await asyncio.sleep(1.0)
    print(f"bench: the controller did not settle in {SETTLE_MAX_S:g} s", file=sys.stderr)


async def _same_answers(http: aiohttp.ClientSession, base: str, local: str, body: bytes) -> None:
    """The controller and the in-process extender decide alike over the same fleet."""
    for verb in VERBS:
        answers = []
        for url in (base, local):
            async with http.post(f"{url}/scheduler/{verb}", data=body) as resp:
                answers.append((resp.status, json.loads(await resp.read())))
        if answers[0] != answers[1]:
            raise RuntimeError(f"{verb}: the process and in-process answers differ")
        if verb == "filter" and answers[0][1].get("Error"):
            raise RuntimeError(f"filter: {answers[0][1]['Error']}")


async def _measure(
    http: aiohttp.ClientSession, base: str, n: int, out: dict[str, list[float]]
) -> None:
    names = [node_name(i) for i in range(n)]
    body = extender_body(names)
    fleet = fleet_of((i, *_report(i)) for i in range(n))
    async with serve_extender(fleet, names) as local:
        await _same_answers(http, base, local, body)
        for _ in range(ROUNDS):
            for verb in VERBS:
                proc: list[float] = []
                inproc: list[float] = []
                for i in range(WARMUP + REQUESTS):
                    t = await timed_post(http, f"{base}/scheduler/{verb}", body)
                    t_local = await timed_post(http, f"{local}/scheduler/{verb}", body)
                    if i >= WARMUP:
                        proc.append(t)
                        inproc.append(t_local)
                add = out.setdefault
                for where, times in (("process", proc), ("inprocess", inproc)):
                    add(f"extender_{where}_{verb}_p50_ms_{n}", []).append(statistics.median(times))
                    add(f"extender_{where}_{verb}_p99_ms_{n}", []).append(percentile(times, 99))
                add(f"extender_process_{verb}_vs_inprocess_{n}", []).append(
                    statistics.median(proc) / statistics.median(inproc)
                )


def _handler_note(before: dict[str, float], after: dict[str, float]) -> str:
    """The controller's own view of the measured calls (``gpuhealth_extender_duration_seconds``:
    decode, decide, encode; no HTTP, no waiting for the event loop): mean, share over 25 ms."""
    parts = []
    for verb in VERBS:
        name = "gpuhealth_extender_duration_seconds"
        count, total = (
            after.get(f'{name}_{k}{{verb="{verb}"}}', 0.0)
            - before.get(f'{name}_{k}{{verb="{verb}"}}', 0.0)
            for k in ("count", "sum")
        )
        key = f'{name}_bucket{{le="0.025",verb="{verb}"}}'
        fast = after.get(key, 0.0) - before.get(key, 0.0)
        if count:
            parts.append(
                f"{verb} handler mean {1000 * total / count:.2f} ms, "
                f"{100 * (count - fast) / count:.1f} % over 25 ms"
            )
    return "; ".join(parts) or "no extender histogram"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _run() -> dict[str, list[float]]:
    from gpuhealth.controller.kube.client import make_api_client
    from localkube import ControlPlane

    helpers: Any = importlib.import_module("tests.integration.controller_helpers")
    _raise_nofile()  # inherited by the controller: 5,000 streams need more than 1,024 fds
    out: dict[str, list[float]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-extender-") as tmp:
        workdir = Path(tmp)
        try:
            async with ControlPlane() as cp:
                admin = await make_api_client(str(cp.kubeconfig))
                try:
                    kube = helpers.Cluster(cp, admin)
                    await kube.release()
                    async with (
                        helpers.controller_process(kube, workdir, OVERRIDES) as (ctl, base),
                        aiohttp.ClientSession() as http,
                    ):
                        await _phases(kube, http, (ctl.pid, base), workdir, out, t0)
                finally:
                    await admin.close()
        except BaseException:
            print(
                f"bench: controller log tail:\n{_tail(workdir / 'controller.log')}", file=sys.stderr
            )
            print(f"bench: agents log tail:\n{_tail(workdir / 'agents.log')}", file=sys.stderr)
            raise
    return out


async def _phases(
    kube: Any,
    http: aiohttp.ClientSession,
    controller: tuple[int, str],
    workdir: Path,
    out: dict[str, list[float]],
    t0: float,
) -> None:
    def note(what: str) -> None:
        print(f"bench: {time.monotonic() - t0:5.1f} s {what}", file=sys.stderr, flush=True)

    pid, base = controller
    done = 0
    with ExitStack() as stack:
        for n in NODE_COUNTS:
            agents = stack.enter_context(_agents_process(base, workdir / "agents.log"))
            await _populate(kube, range(done, n), agents)
            note(f"{n} nodes, agent pods and tokens")
            await _until_reporting(http, base, n, agents)
            note(f"{n} agents reporting")
            await _settle(http, base)
            note("controller settled")
            before, cpu0, t1 = await _metrics(http, base), _proc_cpu_s(pid), time.monotonic()
            await _measure(http, base, n, out)
            cpu = (_proc_cpu_s(pid) - cpu0) / (time.monotonic() - t1)
            note(f"{n} nodes measured; {_handler_note(before, await _metrics(http, base))}")
            note(f"the controller used {100 * cpu:.0f} % of a core meanwhile")
            done = n


TARGETS: dict[int, dict[str, float]] = {
    100: {"process_p50": 2.0, "process_p99": 10.0, "inprocess_p50": 1.0, "inprocess_p99": 2.0,
          "ratio": 3.0},
    5000: {"process_p50": 10.0, "process_p99": 25.0, "inprocess_p50": 2.5, "inprocess_p99": 5.0,
           "ratio": 2.5},
}  # fmt: skip
"""Per N, in ms (ratio in x). Through the process at 5,000 nodes, p99 <= 25 ms: kube-scheduler
calls filter, then prioritize, in the scheduling cycle of every pod that asks for GPUs, one
pod at a time, so 25 ms each keeps the extender under 50 ms of such a cycle at the 99th
percentile, small beside what starting a GPU pod costs and 80 times below the shipped
``httpTimeout: 2s``, past which the scheduler (``ignorable: true``) places pods without
gpuhealth; p50 <= 10 ms. At 100 nodes the body is small and the process's fixed cost shows:
p50 <= 2 ms, p99 <= 10 ms. In-process: ``extender_5000_nodes``' 5 ms p99 at 5,000. The ratios
(what the process adds on top of the same handlers in-process) are about 1.5 times the
1.2-1.7 (5,000) and 1.3-1.4 (100) of the first runs on the 2-core reference machine, whose
absolute figures were far above target under a load average of 8-11 from other work: the
ratio is what tells a slower controller from a loaded machine."""


def _targets() -> tuple[Target, ...]:
    rows: list[Target] = []
    for n, limit in TARGETS.items():
        for verb in VERBS:
            for where in ("process", "inprocess"):
                for stat in ("p50", "p99"):
                    metric = f"extender_{where}_{verb}_{stat}_ms_{n}"
                    rows.append(Target(metric, "ms", limit[f"{where}_{stat}"], "<="))
            ratio = f"extender_process_{verb}_vs_inprocess_{n}"
            rows.append(Target(ratio, "x", limit["ratio"], "<="))
    return tuple(rows)


BENCHMARKS = [
    Benchmark(
        name="extender_process",
        targets=_targets(),
        run=_run,
        needs_kube=True,
        repeats=1,
    ),
]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_extender_process")
    ap.add_argument("mode", choices=["agents"])
    ap.add_argument("--url", required=True, help="ws://HOST:PORT/v1/stream")
    args = ap.parse_args(argv)
    asyncio.run(_agents(args.url))


if __name__ == "__main__":
    main()
