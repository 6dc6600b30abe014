"""Kernel-log benchmarks of a real agent process whose kernel log is a regular file (the chart's
``agent.kmsg.hostPathType=File``: a log forwarder's copy, the e2e node).

- ``cold_first_fault_ms``: ``gpuhealth-agent`` spawned -> the first XID's verdict on
  ``/api/v1/status``. The agent follows the file from its end (tail -F), so the XID line is
  appended as soon as the agent is ready and its kernel-log source is up; the figure includes
  the process start (imports, the XID catalog, the simulator's first poll).
- ``first_xid_to_verdict_ms``: that first line appended -> its verdict: what loading the XID
  catalog on the first XID used to cost (130-785 ms), now loaded at start.
- ``kmsg_cold_<transport>_misses``: of ``COLD_ROUNDS`` cold starts, how many never showed the
  XID written ``COLD_WRITE_AFTER_S`` after the spawn, whether the agent followed yet or not (a
  driver does not wait for the agent): a file (read back from the start of this boot's window,
  ``kmsg.file_lookback_*``) and a FIFO (its writer holds it open, so the line waits in the
  pipe buffer). ``kmsg_cold_file_from_end_misses``: the same with ``file_lookback_bytes: 0``,
  the follower starting at the file's end as it did before it kept a position.
  ``kmsg_cold_<transport>_first_fault_ms``: spawn -> that XID's verdict, per round.
- ``kmsg_cold_file_recreated_misses``: the same cold starts of one agent on one state dir,
  the followed file removed and created anew (empty) before each start, as a log shipper's
  test harness does: on ext4 the new file usually gets the old inode number, and the line,
  as long as the one handled before, makes it exactly as long as the saved offset (the
  position is a file's identity, its birth time and a fingerprint of its content, not its
  inode alone). Each round's XID 79 is on another GPU (the verdicts latch across restarts).
  ``kmsg_cold_file_recreated_first_fault_ms``: spawn -> verdict, per round;
  ``kmsg_cold_file_recreated_inode_reused``: rounds whose new file had the old inode number.
  /dev/kmsg is not measured: the benchmark would write fake XIDs into the host's kernel log
  (every monitor of the machine reads it); its ring buffer is replayed at start
  (tests/unit/agent/sources/kmsg/test_replay.py).
- ``kmsg_file_idle_cpu_percent``: user+system CPU of the agent, in % of one core, over
  ``IDLE_WINDOW_S`` while the followed file stays quiet (inotify, re-checked every
  ``kmsg.file_poll_max_s``); the simulator polls every 60 s so that the follower dominates.
  ``kmsg_file_idle_cpu_percent_10ms_poll`` is the same process configured like the follower
  before inotify (``use_inotify: false``, a fixed 10 ms poll), measured in the same run.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from bench.bench_agent import SIM_PCI_BUS
from bench.registry import Benchmark, Target

IDLE_WINDOW_S = 20.0
IDLE_WINDOWS = 2
WARMUP_S = 3.0
OLD_POLL = {"file_poll_interval_s": 0.01, "file_poll_max_s": 0.01, "use_inotify": False}
"""The follower as it was: a fixed 10 ms poll of the file."""


COLD_ROUNDS = 8
COLD_WRITE_AFTER_S = 0.5


class _FileAgent:
    def __init__(
        self, tmp: Path, poll_interval_s: float, kmsg: Mapping[str, object], fifo: bool = False
    ) -> None:
        self.tmp = tmp
        self.log = tmp / ("kmsg.fifo" if fifo else "kern.log")
        self.fifo_fd: int | None = None
        if fifo:
            os.mkfifo(self.log)
            self.fifo_fd = os.open(self.log, os.O_RDWR | os.O_NONBLOCK)  # holds the buffer
        else:
            self.log.write_text("")
        (tmp / "scenario.yaml").write_text(
            f"name: bench\ngpus: 8\npoll_interval_s: {poll_interval_s}\n"
        )
        lines = ["kmsg:"] + [
            f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in kmsg.items()
        ]
        (tmp / "config.yaml").write_text("\n".join(lines) + "\n" if kmsg else "{}\n")
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.spawned = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        exe = Path(sys.executable).with_name("gpuhealth-agent")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuhealth.agent.cli"]
        self.spawned = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            *cmd,
            "--config", str(self.tmp / "config.yaml"),
            "--node-name", "bench-node",
            "--source", "sim",
            "--sim-scenario", str(self.tmp / "scenario.yaml"),
            "--kmsg-path", str(self.log),
            "--listen", f"127.0.0.1:{self.port}",
            "--state-dir", str(self.tmp / "state"),
            "--podresources-socket", str(self.tmp / "no-kubelet.sock"),
            "--log-format", "json",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def wait_following(self, http: aiohttp.ClientSession) -> None:
        """Ready (inventory and a poll) and the kernel-log source up (following the file)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{self.base}/readyz") as r:
                    ready = r.status == 200
                async with http.get(f"{self.base}/metrics") as r:
                    text = await r.text()
                if ready and 'gpuhealth_agent_source_up{source="kmsg"} 1.0' in text:
                    return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.005)
        raise RuntimeError("agent did not follow its kernel log in 30 s")

    def append(self, line: str) -> None:
        if self.fifo_fd is not None:
            os.write(self.fifo_fd, line.encode())
            return
        with self.log.open("a") as f:
            f.write(line)

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.fifo_fd is not None:
            os.close(self.fifo_fd)
            self.fifo_fd = None


def _xid_line(gpu: int, xid: int) -> str:
    """A kern.log line stamped now (local time, as rsyslog's traditional format)."""
    t = time.localtime()
    stamp = f"{time.strftime('%b', t)} {t.tm_mday:2d} {time.strftime('%H:%M:%S', t)}"
    return (
        f"{stamp} bench-node kernel: [ 966.503025] NVRM: Xid "
        f"(PCI:0000:{SIM_PCI_BUS[gpu]:02x}:00): {xid}, pid=1, name=python3, "
        "GPU has fallen off the bus.\n"
    )


async def _verdict(
    http: aiohttp.ClientSession, base: str, gpu: int, xid: int, within_s: float = 10.0
) -> float | None:
    """When the XID showed on ``/api/v1/status`` (perf_counter); None: not within ``within_s``
    (an agent not answering yet is waited for)."""
    deadline = time.perf_counter() + within_s
    while time.perf_counter() < deadline:
        try:
            async with http.get(f"{base}/api/v1/status") as r:
                body = await r.json() if r.status == 200 else {"gpus": []}
        except aiohttp.ClientError:
            body = {"gpus": []}
        gpus = body["gpus"]
        if len(gpus) > gpu and any(c.get("xid") == xid for c in gpus[gpu]["conditions"]):
            return time.perf_counter()
        await asyncio.sleep(0.001)
    return None


async def run_cold() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        agent = _FileAgent(Path(d), 1.0, {})
        async with aiohttp.ClientSession() as http:
            try:
                await agent.start()
                await agent.wait_following(http)
                written = time.perf_counter()
                agent.append(_xid_line(3, 79))
                seen = await _verdict(http, agent.base, 3, 79)
                if seen is None:
                    raise RuntimeError("XID 79 on GPU 3 did not show in 10 s")
            finally:
                await agent.stop()
    return {
        "cold_first_fault_ms": (seen - agent.spawned) * 1000,
        "first_xid_to_verdict_ms": (seen - written) * 1000,
    }


async def _cold_round(fifo: bool, kmsg: Mapping[str, object]) -> float | None:
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        return await _fault_after_spawn(_FileAgent(Path(d), 1.0, kmsg, fifo=fifo), 5, 48)


async def _fault_after_spawn(agent: _FileAgent, gpu: int, xid: int) -> float | None:
    """Spawn the agent, write one XID ``COLD_WRITE_AFTER_S`` later (followed or not): spawn
    -> verdict in ms, None when it never showed."""
    async with aiohttp.ClientSession() as http:
        try:
            await agent.start()
            await asyncio.sleep(COLD_WRITE_AFTER_S - (time.perf_counter() - agent.spawned))
            agent.append(_xid_line(gpu, xid))
            seen = await _verdict(http, agent.base, gpu, xid, within_s=15.0)
        finally:
            await agent.stop()
    return None if seen is None else (seen - agent.spawned) * 1000


async def run_cold_misses() -> dict[str, float | list[float]]:
    out: dict[str, float | list[float]] = {}
    for name, fifo, kmsg in (
        ("file", False, {}),
        ("fifo", True, {}),
        ("file_from_end", False, {"file_lookback_bytes": 0}),
    ):
        rounds = [await _cold_round(fifo, kmsg) for _ in range(COLD_ROUNDS)]
        out[f"kmsg_cold_{name}_misses"] = float(sum(r is None for r in rounds))
        if name != "file_from_end":
            out[f"kmsg_cold_{name}_first_fault_ms"] = [r for r in rounds if r is not None]
    return out


async def run_cold_recreated() -> dict[str, float | list[float]]:
    rounds: list[float | None] = []
    reused = 0
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        tmp = Path(d)
        before: int | None = None
        for i in range(COLD_ROUNDS):
            (tmp / "kern.log").unlink(missing_ok=True)
            agent = _FileAgent(tmp, 1.0, {})  # the file created anew, the state dir kept
            ino = agent.log.stat().st_ino
            reused += ino == before
            before = ino
            rounds.append(await _fault_after_spawn(agent, i % 8, 79))
    return {
        "kmsg_cold_file_recreated_misses": float(sum(r is None for r in rounds)),
        "kmsg_cold_file_recreated_first_fault_ms": [r for r in rounds if r is not None],
        "kmsg_cold_file_recreated_inode_reused": float(reused),
    }


async def _idle_cpu(kmsg: Mapping[str, object]) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as d:
        agent = _FileAgent(Path(d), 60.0, kmsg)
        async with aiohttp.ClientSession() as http:
            try:
                await agent.start()
                await agent.wait_following(http)
                await asyncio.sleep(WARMUP_S)
                out = []
                for _ in range(IDLE_WINDOWS):
                    cpu0, t0 = agent.cpu_s(), time.monotonic()
                    await asyncio.sleep(IDLE_WINDOW_S)
                    out.append((agent.cpu_s() - cpu0) / (time.monotonic() - t0) * 100)
            finally:
                await agent.stop()
    return out


async def run_idle() -> dict[str, list[float]]:
    return {
        "kmsg_file_idle_cpu_percent": await _idle_cpu({}),
        "kmsg_file_idle_cpu_percent_10ms_poll": await _idle_cpu(OLD_POLL),
    }


BENCHMARKS = [
    Benchmark(
        name="agent_kmsg_cold_first_fault",
        targets=(
            Target("cold_first_fault_ms", "ms", 5000.0, "<="),
            Target("first_xid_to_verdict_ms", "ms", 50.0, "<="),
        ),
        run=run_cold,
    ),
    Benchmark(
        name="agent_kmsg_cold_start_misses",
        targets=(
            Target("kmsg_cold_file_misses", "rounds", 0.0, "<="),
            Target("kmsg_cold_fifo_misses", "rounds", 0.0, "<="),
            Target("kmsg_cold_file_from_end_misses", "rounds", float(COLD_ROUNDS), "<="),
            Target("kmsg_cold_file_first_fault_ms", "ms", 5000.0, "<="),
            Target("kmsg_cold_fifo_first_fault_ms", "ms", 5000.0, "<="),
        ),
        run=run_cold_misses,
        repeats=1,
    ),
    Benchmark(
        name="agent_kmsg_cold_recreated",
        targets=(
            Target("kmsg_cold_file_recreated_misses", "rounds", 0.0, "<="),
            Target("kmsg_cold_file_recreated_first_fault_ms", "ms", 5000.0, "<="),
            Target("kmsg_cold_file_recreated_inode_reused", "rounds", float(COLD_ROUNDS), "<="),
        ),
        run=run_cold_recreated,
        repeats=1,
    ),
    Benchmark(
        name="agent_kmsg_file_idle",
        targets=(
            Target("kmsg_file_idle_cpu_percent", "%", 0.2, "<="),
            Target("kmsg_file_idle_cpu_percent_10ms_poll", "%", 100.0, "<="),
        ),
        run=run_idle,
        repeats=1,
    ),
]
