"""No kernel-log XID lost or counted twice across restarts of the real agent process.

A writer thread appends XID lines (kern.log's RFC 3339 stamp, a unique ``pid=`` per line) to the
followed transport every few milliseconds, also while the agent is down or starting, while
``gpuhealth-agent`` is stopped and started again (SIGTERM, and SIGKILL for a crash) with the
file rotated in between (while up and while down). Every line must be logged by the agent
(``kernel_log_xid``, its JSON log) exactly once as a fresh line (a line a crashed run handed
on may come back once as ``redelivered``), and every (GPU, XID) written must be a condition
of the GPU state at the end. A FIFO keeps no position: its writer holds the FIFO open, so
what it writes while no agent reads waits in the pipe buffer (docs/operations.md). A followed
file is more than its inode: removed and created anew with the old inode number, copied and
truncated and grown back past the saved offset, rotated with and without the old file beside,
its lines are still each handled once. Where the agent is killed, the test decides on which
side of the position's save the kill lands (never timing): after the engine took every line
(the position past them, read from the state store), or after an XID was handed on and
before its position was saved (the engine holds XIDs until the first GPU inventory, which
the simulator delays).
"""

from __future__ import annotations

import json
import os
import shutil
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
from gpuhealth.agent.boot import read_boot_id
from gpuhealth.agent.sources.kmsg.libc import birth_time
from tests.support.agent_process import SimAgentProcess
from tests.support.kmsg_files import give_position_inode, recreate, running_position
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

XIDS = (48, 62, 64, 74, 79, 95, 119, 120)
"""XIDs that each latch a condition of their own."""
GPUS = 8


def xid_line(n: int, xids: tuple[int, ...] = XIDS) -> str:
    """Line ``n``: its own pid, the RFC 3339 stamp with microseconds (as long as every other
    line where every XID in ``xids`` has as many digits)."""
    gpu, xid = n % GPUS, xids[(n // GPUS) % len(xids)]
    stamp = datetime.now(UTC).isoformat(timespec="microseconds")
    return (
        f"{stamp} gpu-node kernel: NVRM: Xid (PCI:0000:{SIM_PCI_BUS[gpu]:02x}:00): {xid}, "
        f"pid={n:06d}, name=writer, line {n:06d}\n"
    )


def written_pairs(n: int, xids: tuple[int, ...] = XIDS) -> set[tuple[int, int]]:
    return {(i % GPUS, xids[(i // GPUS) % len(xids)]) for i in range(n)}


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


EQUAL_XIDS = (48, 62, 64, 74, 79, 95)
"""XIDs of two digits: lines of these are all of one length."""


class Numbered:
    """Numbers the equal-length lines written to one followed file."""

    def __init__(self) -> None:
        self.count = 0

    def lines(self, k: int) -> bytes:
        out = "".join(xid_line(self.count + i, EQUAL_XIDS) for i in range(k))
        self.count += k
        return out.encode()


def _wait_position(agent: Agent, log: Path, what: str, held: bool) -> None:
    """Until the position the agent saved covers every line of ``log`` (``held`` False), or
    stays before an XID it handed on (``held``: the engine holds it)."""
    state = agent.log.parent / "state"

    def there() -> bool:
        pos = running_position(state)
        if pos is None or pos.file is None:
            return False
        size = log.stat().st_size
        if held:
            return bool(pos.handed) and pos.file.offset < size
        return (pos.file.ino, pos.file.offset, pos.handed) == (log.stat().st_ino, size, ())

    until_sync(there, what, timeout_s=30, diagnostics=lambda: str(running_position(state)))


def _scenario(tmp_path: Path, held: bool) -> None:
    """The simulator's scenario; ``held``: no GPU inventory for 10 minutes, so the engine
    holds every XID and the kernel-log position stays before the first."""
    delay = "inventory_delay_s: 600\n" if held else ""
    (tmp_path / "scenario.yaml").write_text(
        f"name: identity\ngpus: {GPUS}\npoll_interval_s: 1\n{delay}"
    )


def test_a_file_that_is_more_than_its_inode_loses_and_repeats_no_line_across_restarts(
    tmp_path: Path, agents: list[Agent]
) -> None:
    """The agent restarted for each fault, the log file changed while it is down, one XID
    line written 0.5 s after each spawn (followed yet or not), every line as long as every
    other: removed and created anew with the old inode number (empty, or already holding as
    many lines as the old one, so exactly as long as the saved offset), copied and truncated
    and grown back past the saved offset, rotated with the old file beside the new one and
    without it. Every line is logged fresh exactly once (a SIGKILL may add a redelivery).
    A SIGKILL before a copytruncate lands after the run's XID was handed on and before its
    position was saved (at offset 0 of the file it read from its start: only the line handed
    on tells the copy); the others after the engine took every line (a file removed then
    takes the lines the engine never took with it)."""
    log = tmp_path / "kern.log"
    log.write_text("")
    boot = read_boot_id()
    n = Numbered()
    on_disk = 0
    """Lines in the file at the path now."""
    reuse: Counter[str] = Counter()

    def recreate_same_inode(k: int) -> None:
        nonlocal on_disk
        if recreate(log, n.lines(k), same_inode=True):
            reuse["observed"] += 1
        else:  # this filesystem did not hand the number out again: the position names it
            give_position_inode(tmp_path / "state", boot, log)
            reuse["forced"] += 1
        on_disk = k

    def copytruncate() -> None:
        nonlocal on_disk
        with log.open("ab") as f:
            f.write(n.lines(2))  # after the stop: in the copy only
        shutil.copyfile(log, tmp_path / "kern.log.1")
        with log.open("r+b") as f:
            f.truncate(0)
        log.write_bytes(n.lines(on_disk + 3))  # grown back past the saved offset
        on_disk += 3

    def rotate(beside: bool) -> None:
        nonlocal on_disk
        if beside:
            with log.open("ab") as f:
                f.write(n.lines(2))  # after the stop: read from kern.log.1
        log.rename(tmp_path / "kern.log.1")
        if not beside:
            (tmp_path / "kern.log.1").unlink()
        log.write_bytes(n.lines(1))
        on_disk = 1

    changes: list[tuple[signal.Signals, str]] = [
        (signal.SIGTERM, "recreate, same inode, as long as the offset"),
        (signal.SIGKILL, "recreate, same inode, empty"),
        (signal.SIGTERM, "copytruncate, grown back"),
        (signal.SIGKILL, "recreate, same inode, as long as the offset"),
        (signal.SIGTERM, "rotate, old file beside"),
        (signal.SIGTERM, "recreate, same inode, empty"),
        (signal.SIGKILL, "copytruncate, grown back"),
        (signal.SIGTERM, "rotate, old file gone"),
        (signal.SIGKILL, "recreate, same inode, as long as the offset"),
        (signal.SIGTERM, "none"),
    ]
    for run, (sig, change) in enumerate([*changes, (signal.SIGTERM, "")]):
        holding = sig == signal.SIGKILL and change.startswith("copytruncate")
        _scenario(tmp_path, holding)
        spawned = time.monotonic()
        agent = Agent(tmp_path, log, run)
        agents.append(agent)
        time.sleep(max(0.0, 0.5 - (time.monotonic() - spawned)))
        with log.open("ab") as f:  # the fault: 0.5 s after the spawn, followed yet or not
            f.write(n.lines(1))
        on_disk += 1
        agent.wait_following()
        until_sync(
            lambda: set(range(n.count)) <= set().union(*logged_xids(tmp_path)),
            f"run {run}: all {n.count} lines in the agent's log",
            timeout_s=30,
            diagnostics=lambda a=agent: a.log.read_text()[-3000:],  # type: ignore[misc]
        )
        if not change:  # the last run: every (GPU, XID) written is a condition of its GPU
            status = agent.status()
            conditions = [(g["index"], c) for g in status["gpus"] for c in g["conditions"]]
            held = {(i, c["xid"]) for i, c in conditions if c.get("xid")}
            assert held == written_pairs(n.count, EQUAL_XIDS)
        if sig == signal.SIGKILL:
            side = "handed on, not saved" if holding else "saved past every line"
            _wait_position(agent, log, f"run {run}: the position {side}", holding)
        agent.stop(sig)
        if change.startswith("recreate"):
            recreate_same_inode(on_disk if "as long" in change else 0)
        elif change.startswith("copytruncate"):
            copytruncate()
        elif change.startswith("rotate"):
            rotate(beside="beside" in change)
    fresh, again = logged_xids(tmp_path)
    print(
        f"identity: {n.count} lines over {len(changes) + 1} runs, redelivered "
        f"{sum(again.values())}, inode reuse {dict(reuse)}"
    )
    assert set(fresh) | set(again) == set(range(n.count))  # none lost
    assert [pid for pid, k in fresh.items() if k > 1] == []  # none counted twice
    assert sum(reuse.values()) == 5
    reasons = Counter(
        json.loads(raw)["reason"]
        for path in tmp_path.glob("agent-*.log")
        for raw in path.read_text().splitlines()
        if '"kmsg_file_start"' in raw
    )
    mismatches = reasons["inode-reused"] + reasons["fingerprint-mismatch"] + reasons["truncated"]
    # a rotation with the old file beside keeps its inode in use: another inode at the path;
    # with the old file gone, the new file may get its number again (then told by content)
    assert reasons["resumed"] >= 1 and reasons["rotated"] >= 1
    assert reasons["rotated"] + mismatches == 9 and mismatches >= 7


def test_an_xid_held_at_a_kill_at_a_files_start_is_found_in_the_copy_of_it(
    tmp_path: Path, agents: list[Agent]
) -> None:
    """The agent is killed after handing on the first XID of a file it reads from its start
    and before the engine took it (no GPU inventory yet): its position stays at offset 0,
    which any file matches. The file is copied and truncated while the agent is down, and
    grows back: the copy holds the line handed on where it was, so it is the saved file's
    content, read first (that line again as a redelivery, the two written after the kill
    fresh), then the regrown file."""
    log = tmp_path / "kern.log"
    log.write_text("")
    _scenario(tmp_path, held=True)
    n = Numbered()
    first = Agent(tmp_path, log, 0)
    agents.append(first)
    first.wait_following()
    with log.open("ab") as f:
        f.write(n.lines(1))
    _wait_position(first, log, "the XID handed on, its position not saved past it", held=True)
    saved = running_position(tmp_path / "state")
    assert saved is not None and saved.file is not None and saved.file.offset == 0
    first.stop(signal.SIGKILL)

    with log.open("ab") as f:
        f.write(n.lines(2))  # after the kill: in the copy only
    shutil.copyfile(log, tmp_path / "kern.log.1")
    with log.open("r+b") as f:
        f.truncate(0)
    log.write_bytes(n.lines(4))  # grown back past the line handed on
    _scenario(tmp_path, held=False)
    second = Agent(tmp_path, log, 1)
    agents.append(second)
    second.wait_following()
    until_sync(
        lambda: set(range(n.count)) <= set().union(*logged_xids(tmp_path)),
        f"all {n.count} lines in the agent's log",
        timeout_s=30,
        diagnostics=lambda: second.log.read_text()[-3000:],
    )
    status = second.status()
    held = {(g["index"], c["xid"]) for g in status["gpus"] for c in g["conditions"] if c.get("xid")}
    assert held == written_pairs(n.count, EQUAL_XIDS)
    fresh, again = logged_xids(tmp_path)
    assert (fresh, again) == (Counter(range(n.count)), Counter({0: 1}))
    starts = [
        json.loads(raw) for raw in second.log.read_text().splitlines() if '"kmsg_file_start"' in raw
    ]
    fd = os.open(log, os.O_RDONLY)
    try:  # the same birth time and other content: truncated; with no birth time, the content
        reason = "truncated" if birth_time(fd) is not None else "fingerprint-mismatch"
    finally:
        os.close(fd)
    assert [(s["reason"], s["saved_offset"]) for s in starts] == [(reason, 0)]
    assert starts[0]["rest_of"] == str(tmp_path / "kern.log.1")
    second.stop(signal.SIGTERM)
