"""The real agent process: `promtool check metrics` on its /metrics, and a clean SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.tooling import require
from tests.support.agent_process import agent_cmd, free_port
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

SCENARIO = """\
name: promtool
gpus: 8
poll_interval_s: 0.1
nics:
  - {device: mlx5_0, gpus: [0, 1]}
  - {device: mlx5_bond_0, gpus: [6, 7], link_layer: Ethernet, rate: 200, model: MT4123}
faults:
  - {at: 0, gpu: 3, xid: 79, message: "GPU has fallen off the bus."}
  - {at: 0, gpu: 5, dbe: 1}
  - {at: 0, gpu: 1, xid: 13, pid: 4242, process: python3}
  - {at: 0, nic: mlx5_0, rail_flap: 3, for: 1}
"""


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    port = free_port()
    proc = subprocess.Popen(
        [
            *agent_cmd(),
            "--node-name",
            "gpu-node-7",
            "--source",
            "sim",
            "--sim-scenario",
            str(scenario),
            "--kmsg-path",
            "none",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--podresources-socket",
            str(tmp_path / "kubelet.sock"),
            "--log-format",
            "json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            return _get(f"{base}/readyz")[0] == 200
        except OSError:
            return False

    try:
        until_sync(ready, "the agent to be ready", timeout_s=30, interval_s=0.1)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_promtool_check_metrics(agent: tuple[subprocess.Popen[bytes], str]) -> None:
    promtool = require("promtool", hint="hack/system-deps.sh installs Debian's prometheus")
    _, base = agent

    def faults_shown() -> tuple[int, str] | None:
        """Once the scenario's faults show, every family has series."""
        status, text = _get(f"{base}/metrics")
        shown = "gpuhealth_gpu_condition{" in text and "gpuhealth_gpu_xid_errors_total{" in text
        shown = shown and 'gpuhealth_rdma_port_verdict{code="rail-flapping"' in text
        return (status, text) if shown else None

    status, text = until_sync(faults_shown, "the faults in /metrics", timeout_s=10, interval_s=0.1)
    assert status == 200
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr
    gpus = {line.split('gpu="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("gpuhealth_gpu_temperature_celsius{")}  # fmt: skip
    assert len(gpus) == 8


def test_sigterm_stops_cleanly(agent: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, base = agent
    assert _get(f"{base}/healthz")[0] == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "agent_stopped" in err
    assert "Traceback" not in err


def test_help_runs() -> None:
    res = subprocess.run(
        [*agent_cmd(), "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NODE_NAME": ""},
    )
    assert res.returncode == 0 and "--sim-scenario" in res.stdout
