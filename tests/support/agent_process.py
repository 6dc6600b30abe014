"""The real ``gpuhealth-agent`` process for tests that run it: its command line and a free
port on 127.0.0.1."""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_cmd() -> list[str]:
    """``gpuhealth-agent`` of this interpreter's environment (the module where it is not
    installed as a script)."""
    exe = Path(sys.executable).with_name("gpuhealth-agent")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuhealth.agent.cli"]
