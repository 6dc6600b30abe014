"""``python -m demo`` end to end: the real control plane, agents and controller; every check
passes; a signal stops every process it started.

The demo runs as a subprocess exactly as ``make demo`` runs it. Processes are recognised by
the demo's work directory on their command line (every child gets a path under it).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from demo.plan import build_plan
from tests.integration.chromium_support import screenshot

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 40.0


def processes_under(workdir: Path) -> dict[int, str]:
    """Live processes whose command line mentions ``workdir``."""
    found: dict[int, str] = {}
    needle = str(workdir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[1][:1]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
    return found


async def start_demo(workdir: Path, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "demo", "--plain", "--workdir", str(workdir), *args,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def read_until(proc: asyncio.subprocess.Process, pattern: str, seen: list[str]) -> str:
    assert proc.stdout is not None
    while True:
        raw = await proc.stdout.readline()
        if not raw:
            raise AssertionError(f"demo ended before {pattern!r}:\n" + "".join(seen[-60:]))
        line = raw.decode(errors="replace")
        seen.append(line)
        if re.search(pattern, line):
            return line


@pytest.fixture
def workdir(tmp_path: Path, kube_assets: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUHEALTH_ASSETS", str(kube_assets))
    return tmp_path / "demo"


async def test_demo_end_to_end(workdir: Path) -> None:
    proc = await start_demo(workdir, "--linger", "8")
    seen: list[str] = []
    try:
        line = await asyncio.wait_for(read_until(proc, r"status page http", seen), 90)
        url = line.split("status page ", 1)[1].strip()
        await asyncio.wait_for(read_until(proc, r"all checks passed|deadline", seen), 180)
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.status == 200, "the controller does not serve the status page"
        await screenshot(url, "demo-status-page.png")
        assert proc.stdout is not None
        rest = await asyncio.wait_for(proc.stdout.read(), 60)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    output = "".join(seen) + rest.decode(errors="replace")
    assert not processes_under(workdir), "the demo left processes behind"

    results = dict(re.findall(r"^  ([✔✘]) (.+)$", output.split("demo finished")[-1], re.M))
    failed = {title for title, mark in ((t, m) for m, t in results.items()) if mark == "✘"}
    results = {
        t: m for m, t in re.findall(r"^  ([✔✘]) (.+)$", output.split("demo finished")[-1], re.M)
    }
    failed = {t for t, m in results.items() if m == "✘"}
    assert len(results) == len(build_plan().checks) == 23, output[-3000:]
    # The CLI ran against the live controller: node 0 is unhealthy, so it exits 1.
    assert "$ gpuhealth-controller status   (exit 1" in output
    table = output.split("$ gpuhealth-controller status")[1]
    assert re.search(r"^gpu-node-0\s+unhealthy", table.split("\n", 2)[2], re.M)
    assert not failed, output[-3000:]
    assert proc.returncode == 0
    assert "23/23 checks passed" in output
    # One remediation episode end to end, its stages with their times, and in the CLI.
    episode = re.search(r"^  gpu-node-1 \(reset-gpu\): Returned; (.+)$", output, re.M)
    assert episode is not None, output[-3000:]
    stages = re.findall(r"(\w+) \+(\d+\.\d)s", episode.group(1))
    assert [s for s, _ in stages] == [
        "detected", "quarantined", "drained", "remediated", "validated", "returned",
    ]  # fmt: skip
    seconds = [float(t) for _, t in stages]
    assert seconds == sorted(seconds)
    assert re.search(r"^gpu-node-1\s+Returned\s+reset-gpu\s", table, re.M)
    # The Karpenter node escalated, was guarded, its NodeClaim deleted and the node replaced;
    # its episode (the record) is kept. The demo polls every second: the whole replacement
    # may pass between two polls, which then see it Completed without Deleted.
    assert re.search(
        r"gpu-node-8 replacement (Deleted: NodeClaim gpu-spot-gpu-node-8 deleted"
        r"|Completed: the replaced node is gone \(nodeclaim, pool gpu-spot\))",
        output,
    ), output[-3000:]
    assert "karpenter (stand-in): NodeClaim gpu-spot-gpu-node-8 deleted" in output
    assert re.search(r"^  gpu-node-8 \(escalate\): Escalated; ", output, re.M)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
async def test_demo_signal_stops_everything(workdir: Path, sig: signal.Signals) -> None:
    proc = await start_demo(workdir)
    seen: list[str] = []
    try:
        await asyncio.wait_for(read_until(proc, r"scenario running", seen), 90)
        running = processes_under(workdir)
        # etcd, kube-apiserver, kube-scheduler, kwok, the controller and 9 agents.
        assert len(running) >= 13, running
        proc.send_signal(sig)
        code = await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 128 + sig
    left = processes_under(workdir)
    assert not left, f"left behind after {sig.name}: {left}"
