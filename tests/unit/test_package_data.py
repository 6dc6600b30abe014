"""Package data is found through the installed names from any directory (no ``agent`` or
``controller`` top-level package outside the repository)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
from gpuhealth.agent.health.xid_catalog import catalog, classify
from gpuhealth.controller.status_page.page import _static
assert len(catalog()) > 100
assert classify(79).severity == "unhealthy"
assert _static("app.js")
import importlib.util
assert importlib.util.find_spec("agent") is None, "the bare name must not be importable here"
"""


def test_package_data_outside_the_repository(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
