"""Recordings of what agents send on the stream, against a recording controller on 127.0.0.1.

:class:`RecordingController` stands in for the controller's stream endpoint: it accepts every
WebSocket on ``/v1/stream``, keeps each binary frame with its arrival time and acknowledges
every message (the Hello with the sequence number before it: nothing of the stream applied
yet), so the agent streams as it would to a controller that keeps up.

- :func:`record_real_agent`: the real ``gpuhealth-agent`` process with the simulated GPU source
  (8 H100s, the chart's defaults otherwise: remediation off, no NICs) on a busy node: a
  kubelet PodResources server (``demo.kubelet``, the real v1 proto on a unix socket) reports
  one pod holding every GPU (:func:`bench.fleet_scale_agents.busy_pod`, by UUID as the NVIDIA
  device plugin reports them);
- :func:`record_simulated_agent`: one of the fleet benchmark's simulated agents
  (:mod:`bench.fleet_scale_agents`, its own process) for the same node.

``python -m bench.stream_recording [--seconds 180] [--heartbeat-s 10] [--poll-s 1]``: both for
that long at those intervals (the agent's defaults), in one invocation; prints each one's
profile (:mod:`bench.stream_profile`) as JSON and how the simulated one differs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from bench.fleet_scale_agents import busy_pod
from bench.stream_profile import Frame, differences, profile
from gpuhealth.protocol import Ack, Hello, encode
from gpuhealth.protocol.codec import decode_agent
from localkube.process import free_port
from tests.support.agent_process import agent_cmd

FIRST_FRAME_TIMEOUT_S = 60.0
"""How long an agent may take from its start to its Hello."""
REPO = Path(__file__).resolve().parents[1]


class RecordingController:
    """Accepts agents' streams on ``127.0.0.1:<free port>/v1/stream``, records every frame of
    each (:attr:`streams`, in connection order) and acknowledges every message."""

    def __init__(self) -> None:
        self.streams: list[list[Frame]] = []
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    async def _stream(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        frames: list[Frame] = []
        self.streams.append(frames)
        async for raw in ws:
            if raw.type is not aiohttp.WSMsgType.BINARY:
                continue
            frames.append(Frame(time.monotonic(), raw.data))
            msg = decode_agent(raw.data)
            await ws.send_bytes(encode(Ack(seq=msg.seq - 1 if isinstance(msg, Hello) else msg.seq)))
        return ws

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/stream", self._stream)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def first_frame(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        """Until some stream carried a frame; fails with the log's tail if ``proc`` ended."""
        deadline = time.monotonic() + FIRST_FRAME_TIMEOUT_S
        while not any(self.streams):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"no frame from the agent (rc {proc.poll()}): {tail}")
            await asyncio.sleep(0.05)


@asynccontextmanager
async def recording() -> AsyncIterator[RecordingController]:
    rec = RecordingController()
    await rec.start()
    try:
        yield rec
    finally:
        await rec.stop()


@dataclass(frozen=True)
class BusyNode:
    """The node recorded: its name and the agent's intervals (production defaults)."""

    node: str = "gpu-node-00000"
    heartbeat_s: float = 10.0
    poll_s: float = 1.0
    """The simulated GPUs' poll interval (NVML's: ``nvml.poll_interval_s``)."""
    seed: int = 0


def _gpu_uuids(node: BusyNode, gpus: int) -> list[str]:
    """The UUIDs the agent's simulated GPUs will have (the simulator is deterministic)."""
    from gpuhealth.agent.sources.sim.scenario import Scenario
    from gpuhealth.agent.sources.sim.source import SimSource
    from gpuhealth.common.clock import SystemClock

    inventory = SimSource(Scenario(gpus=gpus), SystemClock(), node.seed).inventory()
    return [g.uuid for g in inventory.gpus]


async def _stopped(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


async def record_real_agent(seconds: float, node: BusyNode, workdir: Path) -> list[list[Frame]]:
    """``seconds`` of the real agent's streams (from its first frame) on a busy node."""
    from demo.kubelet import DemoKubelets, PodAllocation

    gpus = 8
    (workdir / "scenario.yaml").write_text(
        yaml.safe_dump({"name": "busy", "gpus": gpus, "poll_interval_s": node.poll_s})
    )
    config = {
        "stream": {"heartbeat_interval_s": node.heartbeat_s},
        "podresources": {"refresh_interval_s": min(10.0, node.heartbeat_s)},
    }
    (workdir / "agent.yaml").write_text(yaml.safe_dump(config))
    (workdir / "token").write_text("t0ken")
    uuids = _gpu_uuids(node, gpus)
    namespace, pod, container = busy_pod(node.node)
    # A unix socket path is at most 108 bytes: a short directory of its own.
    with tempfile.TemporaryDirectory(prefix="kubelet-") as short:
        kubelets = DemoKubelets(Path(short), [node.node])
        await kubelets.start()
        try:
            kubelets.set_allocations(
                {node.node: [PodAllocation(namespace, pod, container, tuple(uuids))]}
            )
            async with recording() as rec:
                log = workdir / "agent.log"
                with log.open("wb") as err:
                    proc = subprocess.Popen(
                        [
                            *agent_cmd(),
                            f"--config={workdir / 'agent.yaml'}",
                            f"--node-name={node.node}",
                            "--source=sim",
                            f"--sim-scenario={workdir / 'scenario.yaml'}",
                            f"--sim-seed={node.seed}",
                            "--kmsg-path=none",
                            "--rdma-sysfs-root=none",
                            f"--listen=127.0.0.1:{free_port()}",
                            f"--controller-url={rec.url}",
                            f"--token-file={workdir / 'token'}",
                            f"--state-dir={workdir / 'state'}",
                            f"--podresources-socket={kubelets.socket(node.node)}",
                            "--log-format=json",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                try:
                    await rec.first_frame(proc, log)
                    await asyncio.sleep(seconds)
                finally:
                    await _stopped(proc)
                return [list(s) for s in rec.streams]
        finally:
            await kubelets.stop()


async def record_simulated_agent(
    seconds: float, node: BusyNode, workdir: Path, shape: str = "real"
) -> list[list[Frame]]:
    """``seconds`` of one simulated agent's streams (from its first frame), in ``shape``."""
    number = int(node.node.rsplit("-", 1)[1])
    tokens = workdir / "tokens"
    tokens.write_text(f"{number} {node.node} t0ken\n")
    async with recording() as rec:
        log = workdir / "agents.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.fleet_scale_agents",
                    f"--url={rec.url}",
                    f"--tokens={tokens}",
                    f"--heartbeat={shape}",
                    f"--heartbeat-s={node.heartbeat_s}",
                    f"--poll-s={node.poll_s}",
                ],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            await rec.first_frame(proc, log)
            await asyncio.sleep(seconds)
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            await _stopped(proc)
        return [list(s) for s in rec.streams]


async def _both(seconds: float, node: BusyNode) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-rec-") as d:
        real_dir, sim_dir = Path(d) / "real", Path(d) / "sim"
        real_dir.mkdir()
        sim_dir.mkdir()
        real, sim = await asyncio.gather(
            record_real_agent(seconds, node, real_dir),
            record_simulated_agent(seconds, node, sim_dir),
        )
    rp, sp = profile(real[0]), profile(sim[0])
    return {
        "node": dataclasses.asdict(node),
        "seconds": seconds,
        "streams": {"real": len(real), "sim": len(sim)},
        "real": dataclasses.asdict(rp),
        "sim": dataclasses.asdict(sp),
        "differences": differences(rp, sp),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.stream_recording", description=__doc__)
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--heartbeat-s", type=float, default=10.0)
    ap.add_argument("--poll-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    node = BusyNode(heartbeat_s=args.heartbeat_s, poll_s=args.poll_s)
    print(json.dumps(asyncio.run(_both(args.seconds, node)), indent=2, default=str))


if __name__ == "__main__":
    main()
