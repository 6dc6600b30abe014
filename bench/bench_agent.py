"""Agent benchmarks: exporter render time, steady RSS and CPU of a real agent process, and the
latency from a kernel-log XID line to the verdict on /api/v1/status.

- ``agent_metrics_render_ms``: 8 simulated GPUs through the real health engine, every GPU
  allocated (pod labels), snapshot rebuilt before each render (a scrape right after a poll).
- ``agent_rss_mib`` / ``agent_cpu_percent``: ``gpuhealth-agent --source sim`` (8 GPUs, 1 s
  polling, kernel log on a FIFO like /dev/kmsg, a PodResources server in this process
  answering List with all 8 GPUs allocated, so the agent loads grpc as on a real node),
  measured over three consecutive 60 s steady windows after a 5 s
  warm-up, with a /metrics scrape every 5 s; CPU is user+system time of the process over a
  window, in % of one core; RSS is the median of a window's VmRSS readings.
- ``kmsg_to_verdict_ms``: a real ``NVRM: Xid`` line written to the agent's kernel-log FIFO ->
  the condition visible on ``/api/v1/status``; median of 24 lines (3 codes x 8 GPUs).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.registry import Benchmark, Target

SIM_PCI_BUS = [(0x18 + 0x11 * i) & 0xFF for i in range(8)]
XID_CODES = (79, 48, 95)
"""XIDs that each raise their own condition (application XIDs such as 13 or 94 raise none)."""
STEADY_S = 60.0
"""The issue's measurement window for agent_cpu_percent and agent_rss_mib."""
STEADY_WINDOWS = 3
"""Consecutive windows measured in one agent process (the repetitions)."""
WARMUP_S = 5.0


def _render_ms() -> float:
    from gpuhealth.agent.exposition import render
    from gpuhealth.agent.health import HealthEngine, HealthSettings
    from gpuhealth.agent.metrics import make_registry
    from gpuhealth.agent.node_snapshot import NodeSnapshotCache
    from gpuhealth.agent.sources.sim.scenario import Scenario
    from gpuhealth.agent.sources.sim.source import SimSource
    from gpuhealth.agent.stats import AgentStats
    from gpuhealth.common.tasks import Supervisor
    from gpuhealth.protocol import Allocation
    from tests.support.clock import FakeClock

    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    state = NodeSnapshotCache("gpu-node-7", engine, clock)
    sim = SimSource(Scenario(gpus=8), clock, seed=1)

    def sink(obs: object) -> None:
        engine.observe(obs)  # type: ignore[arg-type]

    sink(sim.inventory())
    for t in range(5):
        clock.advance(1.0)
        sim.step(float(t), sink)
    inv = engine.inventory()
    assert inv is not None
    state.set_allocations(
        [
            Allocation(
                namespace="ml-training",
                pod=f"llm-pretrain-worker-{g.index}",
                container="trainer",
                gpu_uuid=g.uuid,
                device_id=g.uuid,
            )
            for g in inv.gpus
        ]
    )
    state.note_sample()
    registry = make_registry(state.snapshot, "0.1.0", AgentStats(Supervisor()))
    times = []
    for _ in range(300):
        state.mark_dirty()
        t0 = time.perf_counter()
        body = render(registry)
        times.append((time.perf_counter() - t0) * 1000)
    assert b'pod="llm-pretrain-worker-7"' in body
    return statistics.median(times)


async def run_render() -> dict[str, float]:
    return {"agent_metrics_render_ms": _render_ms()}


async def _fake_kubelet(socket_path: Path, gpu_uuids: list[str]) -> object:
    """A PodResources v1 server (the real proto) holding every GPU for one pod each."""
    import grpc.aio

    from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc

    class Kubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
        async def List(self, request: object, context: object) -> object:
            return api_pb2.ListPodResourcesResponse(
                pod_resources=[
                    api_pb2.PodResources(
                        namespace="ml-training",
                        name=f"llm-pretrain-worker-{i}",
                        containers=[
                            api_pb2.ContainerResources(
                                name="trainer",
                                devices=[
                                    api_pb2.ContainerDevices(
                                        resource_name="nvidia.com/gpu", device_ids=[u]
                                    )
                                ],
                            )
                        ],
                    )
                    for i, u in enumerate(gpu_uuids)
                ]
            )

    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    return server


def _sim_uuids() -> list[str]:
    """The simulator's GPU UUIDs for the default seed (deterministic)."""
    from gpuhealth.agent.sources.sim.scenario import Scenario
    from gpuhealth.agent.sources.sim.source import SimSource
    from tests.support.clock import FakeClock

    return [g.uuid for g in SimSource(Scenario(gpus=8), FakeClock(), 0).inventory().gpus]


class _Agent:
    """A real ``gpuhealth-agent`` process on the simulator with a kernel-log FIFO."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.fifo = tmp / "kmsg"
        os.mkfifo(self.fifo)
        (tmp / "scenario.yaml").write_text("name: bench\ngpus: 8\npoll_interval_s: 1.0\n")
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, http: aiohttp.ClientSession) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        exe = Path(sys.executable).with_name("gpuhealth-agent")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuhealth.agent.cli"]
        self.proc = await asyncio.create_subprocess_exec(
            *cmd,
            "--node-name", "bench-node",
            "--source", "sim",
            "--sim-scenario", str(self.tmp / "scenario.yaml"),
            "--kmsg-path", str(self.fifo),
            "--listen", f"127.0.0.1:{self.port}",
            "--state-dir", str(self.tmp / "state"),
            "--podresources-socket", str(self.tmp / "kubelet.sock"),
            "--log-format", "json",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{self.base}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("agent did not become ready in 30 s")

    async def open_kmsg_writer(self) -> int:
        """Open the FIFO's write end once the agent holds the read end (ENXIO before)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                return os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def run_steady() -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        agent = _Agent(Path(d))
        kubelet: Any = await _fake_kubelet(Path(d) / "kubelet.sock", _sim_uuids())
        async with aiohttp.ClientSession() as http:
            try:
                await agent.start(http)
                # Open the FIFO for writing like the kernel holds /dev/kmsg: the agent waits
                # in select() and spends nothing until a line arrives.
                fd = await agent.open_kmsg_writer()
                try:
                    await asyncio.sleep(WARMUP_S)
                    rss: list[float] = []
                    cpu: list[float] = []
                    for _ in range(STEADY_WINDOWS):
                        window: list[float] = []
                        cpu0, t0 = agent.cpu_s(), time.monotonic()
                        while time.monotonic() - t0 < STEADY_S:
                            await asyncio.sleep(5.0)
                            async with http.get(f"{agent.base}/metrics") as r:
                                await r.read()
                            window.append(agent.rss_mib())
                        cpu.append((agent.cpu_s() - cpu0) / (time.monotonic() - t0) * 100)
                        rss.append(statistics.median(window))
                    async with http.get(f"{agent.base}/metrics") as r:
                        text = await r.text()
                    if 'pod="llm-pretrain-worker-7"' not in text:
                        raise RuntimeError("the agent did not attribute GPUs to pods")
                finally:
                    os.close(fd)
            finally:
                await agent.stop()
                await kubelet.stop(None)
    return {"agent_rss_mib": rss, "agent_cpu_percent": cpu}


async def run_kmsg() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        agent = _Agent(Path(d))
        async with aiohttp.ClientSession() as http:
            try:
                await agent.start(http)
                fd = await agent.open_kmsg_writer()
                latencies: list[float] = []
                try:
                    for xid in XID_CODES:
                        for gpu, bus in enumerate(SIM_PCI_BUS):
                            latencies.append(await _one_xid(http, agent.base, fd, gpu, bus, xid))
                finally:
                    os.close(fd)
            finally:
                await agent.stop()
    return {"kmsg_to_verdict_ms": statistics.median(latencies)}


async def _one_xid(
    http: aiohttp.ClientSession, base: str, fd: int, gpu: int, bus: int, xid: int
) -> float:
    line = (
        f"3,{1000 + gpu},{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:{bus:02x}:00): "
        f"{xid}, pid='<unknown>', name=<unknown>, injected by bench\n"
    )
    t0 = time.perf_counter()
    os.write(fd, line.encode())
    deadline = t0 + 5.0
    while time.perf_counter() < deadline:
        async with http.get(f"{base}/api/v1/status") as r:
            body = await r.json()
        if any(c.get("xid") == xid for c in body["gpus"][gpu]["conditions"]):
            return (time.perf_counter() - t0) * 1000
    raise RuntimeError(f"XID {xid} on GPU {gpu} did not show in 5 s")


BENCHMARKS = [
    Benchmark(
        name="agent_metrics_render",
        targets=(Target("agent_metrics_render_ms", "ms", 5.0, "<="),),
        run=run_render,
    ),
    Benchmark(
        name="agent_steady_process",
        targets=(
            Target("agent_rss_mib", "MiB", 60.0, "<="),
            Target("agent_cpu_percent", "%", 1.0, "<="),
        ),
        run=run_steady,
        repeats=1,
    ),
    Benchmark(
        name="agent_kmsg_to_verdict",
        targets=(Target("kmsg_to_verdict_ms", "ms", 20.0, "<="),),
        run=run_kmsg,
    ),
]
