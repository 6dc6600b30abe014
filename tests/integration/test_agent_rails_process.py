"""The real ``gpuhealth-agent`` process on the simulator's GPUs and a sysfs tree with two
InfiniBand NICs, each behind its own PCIe switch with one of the GPUs: a port that flaps makes
the GPU behind it (and only it) degraded, in /metrics, /api/v1/status and the Snapshot the
stream sends; a NIC hot-removed is logged, counted and gone, and the agent runs on."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.protocol import Snapshot
from gpuhealth.protocol.codec import decode_agent
from tests.support.agent_process import SimAgentProcess
from tests.support.rdma_sysfs import HOST_A, SysfsTree, below
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

# The simulator's GPU i sits at PCI bus 0x18 + 0x11 * i.
GPU0 = "0000:18:00.0"
GPU1 = "0000:29:00.0"
CONFIG = """\
tick_interval_s: 0.1
rdma:
  sysfs_root: {root}
  poll_interval_s: 0.2
  read_deadline_s: 2
  rails:
    flap_threshold: 2
    flap_window_s: 120
"""


class Agent(SimAgentProcess):
    def __init__(self, tmp_path: Path) -> None:
        self.tree = SysfsTree(tmp_path / "sys")
        switch_b = ("pci0000:15", "0000:15:02.0", "0000:26:00.0")
        self.tree.gpu(below(HOST_A, "0000:17:00.0", GPU0))
        self.tree.nic("mlx5_0", below(HOST_A, "0000:17:01.0", "0000:19:00.0"), netdev="ib0")
        self.tree.gpu(below(switch_b, "0000:27:00.0", GPU1))
        self.tree.nic("mlx5_1", below(switch_b, "0000:27:01.0", "0000:2a:00.0"), netdev="ib1")
        (tmp_path / "scenario.yaml").write_text("name: rails\ngpus: 2\npoll_interval_s: 0.2\n")
        (tmp_path / "agent.yaml").write_text(CONFIG.format(root=self.tree.root))
        (tmp_path / "token").write_text("t0ken")
        self.db = tmp_path / "state" / "state.db"
        super().__init__(
            tmp_path,
            tmp_path / "kmsg",
            tmp_path / "agent.log",
            extra=[
                f"--config={tmp_path / 'agent.yaml'}",
                "--controller-url=ws://127.0.0.1:9/v1/stream",  # nobody: the outbox keeps all
                f"--token-file={tmp_path / 'token'}",
            ],
        )
        (tmp_path / "kmsg").touch()

    def wait(self, what: str, check: Any, timeout_s: float = 30.0) -> Any:
        return until_sync(
            check, what, timeout_s=timeout_s, diagnostics=lambda: self.log.read_text()[-4000:]
        )

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.get("/api/v1/status") or '{"gpus": [], "nics": []}'))

    def metric(self, name: str, **labels: str) -> float | None:
        for line in (self.get("/metrics") or "").splitlines():
            series = line.startswith((name + "{", name + " "))
            if series and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def snapshot(self) -> Snapshot | None:
        """The Snapshot waiting in the stream's outbox (the latest replaces an unsent one)."""
        if not self.db.exists():
            return None
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT frame FROM outbox WHERE kind = 'snapshot' ORDER BY seq DESC LIMIT 1"
            ).fetchall()
        if not rows:
            return None
        msg = decode_agent(rows[0][0])
        assert isinstance(msg, Snapshot)
        return msg

    def flap(self, downed: int) -> None:
        """mlx5_0's link goes down (its counter shows it), a poll sees it, and it comes back."""
        t = self.tree
        t.write("mlx5_0", 1, "state", "1: DOWN")
        t.write("mlx5_0", 1, "phys_state", "2: Polling")
        t.write("mlx5_0", 1, "counters/link_downed", str(downed))
        self.wait(
            "the down seen", lambda: self.metric("gpuhealth_rdma_port_up", device="mlx5_0") == 0
        )
        t.write("mlx5_0", 1, "state", "4: ACTIVE")
        t.write("mlx5_0", 1, "phys_state", "5: LinkUp")
        self.wait(
            "the port up again", lambda: self.metric("gpuhealth_rdma_port_up", device="mlx5_0") == 1
        )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path)
    try:
        yield a
    finally:
        if a.proc.poll() is None:
            a.proc.terminate()
            try:
                a.proc.wait(15)
            except subprocess.TimeoutExpired:
                a.proc.kill()


def _gpus(status: dict[str, Any]) -> dict[int, tuple[str, list[str]]]:
    return {g["index"]: (g["state"], [c["code"] for c in g["conditions"]]) for g in status["gpus"]}


def test_a_flapping_rail_degrades_the_gpu_behind_it(agent: Agent) -> None:
    def both_ports() -> dict[str, Any] | None:
        s = agent.status()
        healthy = [g["state"] for g in s["gpus"]] == ["healthy", "healthy"]
        return s if healthy and len(s["nics"]) == 2 else None

    status = agent.wait("two healthy GPUs and two ports", both_ports)
    uuids = [g["uuid"] for g in status["gpus"]]
    assert [
        (n["device"], [g["index"] for g in n["gpus"]], n["affinity"]) for n in status["nics"]
    ] == [
        ("mlx5_0", [0], "PIX"),
        ("mlx5_1", [1], "PIX"),
    ]
    agent.flap(1)
    agent.flap(2)

    def degraded() -> dict[str, Any] | None:
        s = agent.status()
        return s if _gpus(s).get(0, ("", []))[0] == "degraded" else None

    status = agent.wait("GPU 0 degraded", degraded)
    assert _gpus(status) == {0: ("degraded", ["rail-flapping"]), 1: ("healthy", [])}
    (cond,) = status["gpus"][0]["conditions"]
    assert cond["scope"] == "rail" and cond["action"] == "CHECK_NETWORK"
    assert cond["message"] == "mlx5_0 port 1 (InfiniBand, ib0) went down 2 times within 120 s"
    nic = status["nics"][0]
    assert (nic["flaps"], [v["code"] for v in nic["verdicts"]]) == (2, ["rail-flapping"])

    assert agent.metric("gpuhealth_rdma_port_verdict", device="mlx5_0", code="rail-flapping") == 1
    assert agent.metric("gpuhealth_rdma_port_flaps_total", device="mlx5_0") == 2
    assert agent.metric("gpuhealth_rdma_port_gpu", device="mlx5_0", gpu="0") == 1
    assert agent.metric("gpuhealth_gpu_condition", gpu="0", code="rail-flapping") == 1
    assert agent.metric("gpuhealth_gpu_condition", gpu="1", code="rail-flapping") is None
    assert agent.metric("gpuhealth_agent_source_up", source="rdma") == 1

    def snapshot_with_the_verdict() -> Snapshot | None:
        snap = agent.snapshot()
        return snap if snap and snap.nics and snap.nics[0].verdicts else None

    snap = agent.wait("the Snapshot on the stream", snapshot_with_the_verdict)
    first, second = snap.nics
    assert (first.device, first.gpus, first.flaps, first.verdicts) == (
        "mlx5_0", [uuids[0]], 2, ["rail-flapping"]
    )  # fmt: skip
    assert (second.device, second.gpus, second.verdicts) == ("mlx5_1", [uuids[1]], [])
    gpu0 = next(g for g in snap.gpus if g.info.index == 0)
    assert gpu0.state == "degraded" and [c.code for c in gpu0.conditions] == ["rail-flapping"]


def test_a_hot_removed_nic_is_gone_and_the_agent_runs_on(agent: Agent) -> None:
    agent.wait("two ports", lambda: len(agent.status()["nics"]) == 2)
    agent.tree.remove_device("mlx5_1")
    agent.wait(
        "the removal counted",
        lambda: (
            agent.metric("gpuhealth_agent_rdma_devices_removed_total") == 1
            if agent.metric("gpuhealth_agent_rdma_devices_removed_total") is not None
            else None
        ),
    )
    assert [n["device"] for n in agent.status()["nics"]] == ["mlx5_0"]
    assert [g["state"] for g in agent.status()["gpus"]] == ["healthy", "healthy"]
    log = agent.log.read_text()
    assert '"event": "rdma_device_removed"' in log and "Traceback" not in log
    assert agent.proc.poll() is None
