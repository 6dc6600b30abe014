"""The real ``gpuhealth-agent`` process for tests that run it: its command line (and
localkube's free 127.0.0.1 port, re-exported for them)."""

from __future__ import annotations

import sys
from pathlib import Path

from localkube.process import free_port

__all__ = ["agent_cmd", "free_port"]


def agent_cmd() -> list[str]:
    """``gpuhealth-agent`` of this interpreter's environment (the module where it is not
    installed as a script)."""
    exe = Path(sys.executable).with_name("gpuhealth-agent")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuhealth.agent.cli"]
