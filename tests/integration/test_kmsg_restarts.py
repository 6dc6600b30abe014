"""No kernel-log XID lost or counted twice across restarts of the real agent process.

A writer thread appends XID lines (kern.log's RFC 3339 stamp, a unique ``pid=`` per line) to the
followed transport every few milliseconds, also while the agent is down or starting, while
``gpuhealth-agent`` is stopped and started again (SIGTERM, and SIGKILL for a crash) with the
file rotated in between (while up and while down). Every line must be logged by the agent
(``kernel_log_xid``, its JSON log) exactly once as a fresh line (a line a crashed run handed
on may come back once as ``redelivered``), and every (GPU, XID) written must be a condition
of the GPU state at the end. A FIFO keeps no position: its writer holds the FIFO open, so
what it writes while no agent reads waits in the pipe buffer (docs/operations.md).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.bench_agent import SIM_PCI_BUS
from tests.support.agent_process import SimAgentProcess
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

XIDS = (48, 62, 64, 74, 79, 95, 119, 120)
"""XIDs that each latch a condition of their own."""
GPUS = 8


def xid_line(n: int) -> str:
    gpu, xid = n % GPUS, XIDS[(n // GPUS) % len(XIDS)]
    stamp = datetime.now(UTC).isoformat(timespec="microseconds")
    return (
        f"{stamp} gpu-node kernel: NVRM: Xid (PCI:0000:{SIM_PCI_BUS[gpu]:02x}:00): {xid}, "
        f"pid={n}, name=writer, line {n}\n"
    )


def written_pairs(n: int) -> set[tuple[int, int]]:
    return {(i % GPUS, XIDS[(i // GPUS) % len(XIDS)]) for i in range(n)}


class Writer:
    """Appends one XID line every ``interval_s`` until stopped; ``rotate`` renames the file
    away (kern.log -> kern.log.1 -> kern.log.2) between two lines, as logrotate does."""

    def __init__(self, path: Path, fifo: bool, interval_s: float = 0.01) -> None:
        self.path = path
        self.fifo_fd = os.open(path, os.O_RDWR) if fifo else None  # holds the pipe buffer
        self.count = 0
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                data = xid_line(self.count).encode()
                if self.fifo_fd is not None:
                    os.write(self.fifo_fd, data)
                else:
                    with self.path.open("ab") as f:  # by path each time: rotation follows
                        f.write(data)
                self.count += 1
            time.sleep(self.interval_s)

    def rotate(self) -> None:
        with self._lock:
            older = self.path.with_name(self.path.name + ".1")
            if older.exists():
                older.rename(self.path.with_name(self.path.name + ".2"))
            self.path.rename(older)
            self.path.write_text("")

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.count


class Agent(SimAgentProcess):
    def __init__(self, tmp_path: Path, kmsg: Path, run: int) -> None:
        super().__init__(tmp_path, kmsg, tmp_path / f"agent-{run}.log")

    def wait_following(self) -> None:
        until_sync(
            lambda: 'gpuhealth_agent_source_up{source="kmsg"} 1.0' in (self.get("/metrics") or ""),
            "the agent to follow its kernel log",
            timeout_s=60,
            diagnostics=lambda: self.log.read_text()[-3000:],
        )

    def status(self) -> dict[str, Any]:
        body = self.get("/api/v1/status")
        assert body is not None
        return dict(json.loads(body))

    def stop(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)
        want = 0 if sig == signal.SIGTERM else -signal.SIGKILL
        assert self.proc.wait(30) == want, self.log.read_text()[-3000:]


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(10)


def logged_xids(tmp_path: Path) -> tuple[Counter[int], Counter[int]]:
    """(fresh, redelivered): how often each line (its pid) was logged, over every run."""
    fresh: Counter[int] = Counter()
    again: Counter[int] = Counter()
    for path in sorted(tmp_path.glob("agent-*.log")):
        for raw in path.read_text().splitlines():
            if '"kernel_log_xid"' not in raw:
                continue
            rec = json.loads(raw)
            (again if rec["redelivered"] else fresh)[rec["pid"]] += 1
    return fresh, again


def run_restarts(
    tmp_path: Path, agents: list[Agent], kmsg: Path, stops: list[tuple[signal.Signals, str]]
) -> tuple[int, Counter[int], Counter[int]]:
    """Start the agent, then for each (signal, rotation) stop it with the signal and start it
    again, rotating the file ``up`` (before the stop) or ``down`` (while it is down); the
    writer writes throughout. (lines written, fresh, redelivered)."""
    (tmp_path / "scenario.yaml").write_text(f"name: restarts\ngpus: {GPUS}\npoll_interval_s: 1\n")
    writer = Writer(kmsg, fifo=kmsg.is_fifo())
    try:
        agent = Agent(tmp_path, kmsg, 0)
        agents.append(agent)
        agent.wait_following()
        for run, (sig, rotation) in enumerate(stops, start=1):
            time.sleep(0.3)
            if rotation == "up":
                writer.rotate()
                time.sleep(0.1)
            agent.stop(sig)
            time.sleep(0.2)
            if rotation == "down":
                writer.rotate()
            agent = Agent(tmp_path, kmsg, run)
            agents.append(agent)
            agent.wait_following()
        time.sleep(0.3)
    finally:
        written = writer.stop()

    def all_seen() -> bool:
        fresh, again = logged_xids(tmp_path)
        return set(fresh) | set(again) >= set(range(written))

    until_sync(all_seen, f"all {written} lines in the agent's log", timeout_s=30)
    status = agent.status()
    held = {(g["index"], c["xid"]) for g in status["gpus"] for c in g["conditions"] if c.get("xid")}
    assert held == written_pairs(written)  # reflected in the GPU state, across every restart
    fresh, again = logged_xids(tmp_path)
    agent.stop(signal.SIGTERM)
    if writer.fifo_fd is not None:
        os.close(writer.fifo_fd)
    return written, fresh, again


def test_a_followed_file_loses_and_repeats_no_line_across_restarts_and_rotations(
    tmp_path: Path, agents: list[Agent]
) -> None:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    stops = [
        (signal.SIGTERM, "none"),
        (signal.SIGKILL, "up"),
        (signal.SIGTERM, "down"),
        (signal.SIGKILL, "down"),
        (signal.SIGKILL, "none"),
        (signal.SIGTERM, "up"),
    ]
    written, fresh, again = run_restarts(tmp_path, agents, kmsg, stops)
    print(f"file: {written} lines written, {len(fresh)} seen, redelivered {sum(again.values())}")
    assert written > 300
    assert set(range(written)) <= set(fresh) | set(again)  # none lost
    assert [pid for pid, n in fresh.items() if n > 1] == []  # none counted twice
    assert set(fresh) <= set(range(written))


def test_a_fifo_loses_and_repeats_no_line_across_graceful_restarts(
    tmp_path: Path, agents: list[Agent]
) -> None:
    kmsg = tmp_path / "kmsg.fifo"
    os.mkfifo(kmsg)
    stops = [(signal.SIGTERM, "none")] * 4
    written, fresh, again = run_restarts(tmp_path, agents, kmsg, stops)
    print(f"fifo: {written} lines written, {len(fresh)} seen, redelivered {sum(again.values())}")
    assert written > 200 and not again
    assert set(fresh) == set(range(written))
    assert [pid for pid, n in fresh.items() if n > 1] == []


def _metric(agent: Agent, name: str) -> float | None:
    for line in (agent.get("/metrics") or "").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_an_xid_read_back_before_the_inventory_waits_for_it_across_a_crash(
    tmp_path: Path, agents: list[Agent]
) -> None:
    """NVML's first inventory comes late without persistence mode, after the kernel log's
    replay: the XID waits in the engine, its position is not saved, a crash then loses
    nothing, and the next run applies it once its inventory comes."""
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(xid_line(0))  # GPU 0, XID 48, logged before the agent started
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"name: slow-nvml\ngpus: {GPUS}\ninventory_delay_s: 600\n")
    first = Agent(tmp_path, kmsg, 0)
    agents.append(first)
    first.wait_following()
    until_sync(
        lambda: _metric(first, "gpuhealth_agent_held_xids_total") == 1.0,
        "the read-back XID held for the inventory",
        timeout_s=30,
        diagnostics=lambda: first.log.read_text()[-3000:],
    )
    assert first.status()["gpus"] == []
    first.stop(signal.SIGKILL)  # before any inventory came

    scenario.write_text(f"name: slow-nvml\ngpus: {GPUS}\ninventory_delay_s: 2\n")
    second = Agent(tmp_path, kmsg, 1)
    agents.append(second)
    second.wait_following()

    def xid_48_on_gpu_0() -> bool:
        gpus = second.status()["gpus"]
        return any(
            g["index"] == 0 and any(c.get("xid") == 48 for c in g["conditions"]) for g in gpus
        )

    until_sync(
        xid_48_on_gpu_0,
        "XID 48 on GPU 0 once the inventory came",
        timeout_s=30,
        diagnostics=lambda: second.log.read_text()[-3000:],
    )
    assert _metric(second, "gpuhealth_agent_held_xids_total") == 1.0
    assert _metric(second, "gpuhealth_agent_unmapped_xids_total") == 0.0
    fresh, again = logged_xids(tmp_path)
    assert (fresh, again) == (Counter({0: 1}), Counter({0: 1}))  # read once more, not lost
    second.stop(signal.SIGTERM)
