"""The real ``gpuhealth-agent`` process for tests that run it: its command line (and
localkube's free 127.0.0.1 port, re-exported for them), and a stand-alone agent on the
simulator that follows a kernel-log file."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from localkube.process import free_port

__all__ = ["SimAgentProcess", "agent_cmd", "free_port"]


def agent_cmd() -> list[str]:
    """``gpuhealth-agent`` of this interpreter's environment (the module where it is not
    installed as a script)."""
    exe = Path(sys.executable).with_name("gpuhealth-agent")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuhealth.agent.cli"]


class SimAgentProcess:
    """``gpuhealth-agent --source=sim`` with ``tmp_path/scenario.yaml``, following ``kmsg``,
    its state in ``tmp_path/state``, its log (JSON) in ``log``; no controller (``extra``
    flags may name one, and anything else)."""

    def __init__(self, tmp_path: Path, kmsg: Path, log: Path, extra: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.log = log
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    *agent_cmd(),
                    "--node-name=gpu-node-7",
                    "--source=sim",
                    f"--sim-scenario={tmp_path / 'scenario.yaml'}",
                    f"--kmsg-path={kmsg}",
                    f"--listen=127.0.0.1:{self.port}",
                    f"--state-dir={tmp_path / 'state'}",
                    f"--podresources-socket={tmp_path / 'kubelet.sock'}",
                    "--log-format=json",
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def get(self, path: str) -> str | None:
        """The body of ``GET path`` on the agent's port; None while it does not answer."""
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return None
