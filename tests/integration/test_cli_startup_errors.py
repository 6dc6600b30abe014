"""What an operator sees when agent or controller cannot start: one line on stderr naming the
problem and a non-zero exit, never a Python traceback. The real command lines, as processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localkube import ControlPlane

AGENT = [sys.executable, "-m", "gpuhealth.agent.cli"]
CONTROLLER = [sys.executable, "-m", "gpuhealth.controller.cli"]
DEADLINE_S = 120.0
"""Upper bound for one command (it normally ends within seconds; the machine may be loaded)."""


def run(argv: list[str]) -> tuple[int, list[str]]:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=DEADLINE_S, check=False, cwd="/"
    )
    return proc.returncode, proc.stderr.splitlines()


def assert_one_line(rc: int, lines: list[str], prefix: str, *needles: str) -> None:
    assert rc != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith(prefix + ": ")
    assert "Traceback" not in lines[0]
    for needle in needles:
        assert needle in lines[0]


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, server: str, token: str = "t") -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: u, user: {{token: {token}}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


def agent_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        *AGENT,
        "--source", "sim", "--node-name", "n1", "--listen", "127.0.0.1:0",
        "--kmsg-path", "none", "--podresources-socket", "none",
        "--state-dir", str(tmp_path / "state"),
        *extra,
    ]  # fmt: skip


def test_agent_missing_token_file(tmp_path: Path) -> None:
    rc, lines = run(
        agent_args(
            tmp_path,
            "--controller-url",
            "ws://127.0.0.1:9/v1/stream",
            "--token-file",
            str(tmp_path / "no-token"),
        )
    )
    assert_one_line(rc, lines, "gpuhealth-agent", "no-token")


def test_agent_missing_ca_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc")
    rc, lines = run(
        agent_args(
            tmp_path,
            "--controller-url",
            "wss://127.0.0.1:9/v1/stream",
            "--token-file",
            str(token),
            "--controller-ca-file",
            str(tmp_path / "no-ca.pem"),
        )
    )
    assert_one_line(rc, lines, "gpuhealth-agent", "no-ca.pem")


def test_agent_invalid_config(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("stream:\n  outbox:\n    max_mesages: 5\n")
    rc, lines = run(agent_args(tmp_path, "--config", str(cfg)))
    assert_one_line(rc, lines, "gpuhealth-agent", f"{cfg}:3", "max_mesages")


def test_controller_missing_kubeconfig(tmp_path: Path) -> None:
    rc, lines = run(
        [*CONTROLLER, "--kubeconfig", str(tmp_path / "nope"), "--listen", "127.0.0.1:0"]
    )
    assert_one_line(rc, lines, "gpuhealth-controller", "nope")


@pytest.mark.parametrize(
    "text",
    ["clusters: [\n", "apiVersion: v1\nkind: Config\n", "- just\n- a list\n"],
    ids=["not-yaml", "no-context", "a-list"],
)
def test_controller_invalid_kubeconfig(tmp_path: Path, text: str) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(text)
    rc, lines = run([*CONTROLLER, "--kubeconfig", str(kc), "--listen", "127.0.0.1:0"])
    assert_one_line(rc, lines, "gpuhealth-controller", str(kc))


def test_controller_unreachable_api_server(tmp_path: Path) -> None:
    port = closed_port()
    kc = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    cfg = tmp_path / "controller.yaml"
    cfg.write_text("startup_timeout_s: 2\n")
    rc, lines = run(
        [*CONTROLLER, "--kubeconfig", str(kc), "--config", str(cfg), "--listen", "127.0.0.1:0"]
    )
    assert_one_line(
        rc, lines, "gpuhealth-controller", f"127.0.0.1:{port}", "within 2 s", "startup_timeout_s"
    )


def test_controller_rejected_credentials(tmp_path: Path, control_plane: ControlPlane) -> None:
    """401 from a real API server fails at once (no waiting out startup_timeout_s)."""
    kc = control_plane.token_kubeconfig("not-a-valid-token", "bogus")
    cfg = tmp_path / "controller.yaml"
    cfg.write_text("startup_timeout_s: 600\n")
    rc, lines = run(
        [*CONTROLLER, "--kubeconfig", str(kc), "--config", str(cfg), "--listen", "127.0.0.1:0"]
    )
    assert_one_line(rc, lines, "gpuhealth-controller", "401")
