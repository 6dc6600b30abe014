"""``make demo REAL_NODE=1``: the demo's scenario with its first node a real kubelet node.
Every check passes, the real node is the one tainted for XID 79, and the host is left as it
was."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localkube import hoststate

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 420.0


def test_the_demo_runs_with_a_real_node(node_assets: Path, tmp_path: Path) -> None:
    before = hoststate.take()
    workdir = tmp_path / "demo"
    env = {**os.environ, "GPUHEALTH_ASSETS": str(node_assets), "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--real-node", "--plain", "--linger", "0",
         "--workdir", str(workdir)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "real node gpu-node-0 Ready" in out
    assert re.search(r"finished after \d+s: (\d+)/\1 checks passed", out), out[-3000:]
    assert "gpu-node-0 tainted gpuhealth.io/unhealthy=xid-79:NoSchedule" in out, out[-3000:]
    node_workdir = workdir / "real-node" / "node"
    after = hoststate.take((str(node_workdir),))
    assert hoststate.leftovers(before, after, workdir=node_workdir) == []
