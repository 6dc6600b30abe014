"""One fault, one verdict: the real ``gpuhealth-agent`` process gets the same fault as a GPU
Operational Event (the simulator's, as NVML's event set would bring it) and as the kernel's
``NVRM: Xid`` line, in both orders, and reports one condition (with the structured record's
scope and facts) and one counted occurrence; an event without a legacy Xid is judged by its
category."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.bench_agent import SIM_PCI_BUS
from tests.support.agent_process import SimAgentProcess
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

GPU = 2


class Agent(SimAgentProcess):
    def __init__(self, tmp_path: Path, scenario: str) -> None:
        (tmp_path / "scenario.yaml").write_text(scenario)
        self.kmsg = tmp_path / "kern.log"
        self.kmsg.write_text("")
        super().__init__(tmp_path, self.kmsg, tmp_path / "agent.log")

    def get(self, path: str) -> str:
        return super().get(path) or ""

    def wait(self, what: str, check: Any) -> None:
        until_sync(check, what, timeout_s=60, diagnostics=lambda: self.log.read_text()[-3000:])

    def write_xid(self, xid: int) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        with self.kmsg.open("a") as f:
            f.write(
                f"{stamp} gpu-node kernel: NVRM: Xid (PCI:0000:{SIM_PCI_BUS[GPU]:02x}:00): "
                f"{xid}, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
            )

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def conditions(self) -> list[dict[str, Any]]:
        status = json.loads(self.get("/api/v1/status") or "{}")
        for g in status.get("gpus", []):
            if g["index"] == GPU:
                return list(g["conditions"])
        return []


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        if a.proc.poll() is None:
            a.proc.terminate()
            try:
                a.proc.wait(15)
            except subprocess.TimeoutExpired:
                a.proc.kill()


def following(a: Agent) -> bool:
    return 'gpuhealth_agent_source_up{source="kmsg"} 1.0' in a.get("/metrics")


@pytest.mark.parametrize("order", ["event-first", "kernel-line-first"])
def test_event_and_kernel_xid_are_one_verdict(
    tmp_path: Path, agents: list[Agent], order: str
) -> None:
    at = 1 if order == "event-first" else 6
    a = Agent(
        tmp_path,
        "name: goe\ngpus: 8\npoll_interval_s: 0.5\nfaults:\n"
        f'  - {{at: {at}, gpu: {GPU}, operational_event: "GPU-BUS 0x0003 xid=79 scope=0"}}\n',
    )
    agents.append(a)
    a.wait("the agent to follow its kernel log", lambda: following(a))
    events = "gpuhealth_gpu_operational_events_total"
    if order == "event-first":
        a.wait("the operational event", lambda: a.metric(events) == 1)
        a.write_xid(79)
        a.wait("the kernel line", lambda: a.metric("gpuhealth_agent_kmsg_xids_total") == 1)
    else:
        a.write_xid(79)
        a.wait("the kernel line", lambda: a.metric("gpuhealth_agent_kmsg_xids_total") == 1)
        assert a.metric(events) == 0  # the scenario's event comes later
        a.wait("the operational event", lambda: a.metric(events) == 1)
    time.sleep(1.0)  # anything counted twice would show by now
    conds = a.conditions()
    assert [c["code"] for c in conds] == ["xid-79"], conds
    (c,) = conds
    assert c["severity"] == "unhealthy" and c["action"] == "RESTART_BM"
    assert c["scope"] == "gpu" and "GPU-BUS 0x0003" in c["message"]
    assert a.metric("gpuhealth_gpu_xid_errors_total", xid="79") == 1
    assert a.metric("gpuhealth_agent_duplicate_xids_total") == 1
    assert a.metric(events, module="GPU-BUS", code="0x0003", handled="category") == 1


def test_event_without_legacy_xid_is_judged_by_category(
    tmp_path: Path, agents: list[Agent]
) -> None:
    a = Agent(
        tmp_path,
        "name: goe\ngpus: 8\npoll_interval_s: 0.5\nfaults:\n"
        f"  - {{at: 1, gpu: {GPU}, "
        'operational_event: "GPU-RAS 0x0030 category=2 severity=FATAL"}\n',
    )
    agents.append(a)
    a.wait("the verdict", lambda: bool(a.conditions()))
    (c,) = a.conditions()
    assert (c["code"], c["reason"], c["severity"]) == (
        "goe-gpu-ras-0x0030",
        "UnknownOperationalEvent",
        "degraded",
    )
    assert re.search(r"MEMORY_INTEGRITY_ERROR", c["message"])
    paths = a.get("/metrics")
    assert 'gpuhealth_agent_event_paths{path="kmsg"} 1.0' in paths
