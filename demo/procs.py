"""The demo's gpuhealth processes: one agent per node and the controller, real subprocesses.

Each runs in its own session (a terminal Ctrl-C reaches only the demo, which then stops
them in order) with its log in the work directory. Configuration files are written next to
them; the demo shortens the windows that production keeps long (idle, clean window,
heartbeats) so that everything happens within a few minutes.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from localkube.process import ManagedProcess, ProbeSettings, free_port, http_probe

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DemoTimings:
    """Demo-sized versions of production windows (each named after the setting it sets)."""

    heartbeat_interval_s: float = 2.0
    """Agent ``stream.heartbeat_interval_s`` (production 10 s): usage reaches the controller."""
    podresources_refresh_s: float = 2.0
    """Agent ``podresources.refresh_interval_s`` (production 10 s)."""
    clean_window_s: float = 15.0
    """Agent ``health.clean_window_s`` (production 300 s): a cooled GPU recovers."""
    idle_window_s: float = 20.0
    """Controller ``idle.window_s`` (production 30 min)."""
    idle_evaluate_s: float = 2.0
    """Controller ``idle.evaluate_interval_s`` (production 30 s)."""
    idle_max_gap_s: float = 30.0
    """Controller ``idle.max_gap_s`` (production 300 s): heartbeats come every 2 s here."""
    breaker_max_fraction: float = 0.75
    """Controller ``breaker.max_fraction``: the demo taints 2 of 8 nodes on purpose, and the
    3 nodes of its NVLink domain (admitted whole)."""
    resync_interval_s: float = 30.0
    remediation_soak_s: float = 5.0
    """Controller ``remediation.validation.soak_s`` (production 300 s): the clean window
    after the GPU reset before the node returns."""
    remediation_poll_s: float = 1.0
    """Controller ``remediation.resync_s`` / retry intervals, agent validation checks."""
    stop_grace_s: float = 5.0
    """SIGTERM, then this long, then SIGKILL of the whole process group."""


def _module_argv(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def agent_config(t: DemoTimings) -> dict[str, Any]:
    return {
        "log_format": "json",
        "health": {"clean_window_s": t.clean_window_s},
        "podresources": {"refresh_interval_s": t.podresources_refresh_s},
        "stream": {"heartbeat_interval_s": t.heartbeat_interval_s},
        "remediation": {
            "enabled": True,
            "validation": {"check_interval_s": t.remediation_poll_s},
            "allow_plaintext_orders": True,  # the demo's stream is ws:// on 127.0.0.1
        },
    }


def controller_config(t: DemoTimings, listen: str, kubeconfig: Path) -> dict[str, Any]:
    return {
        "listen": listen,
        "kubeconfig": str(kubeconfig),
        "log_format": "json",
        # The demo's processes talk over 127.0.0.1 in plaintext; the chart serves TLS.
        "allow_plaintext_orders": True,
        # Its status page, status CLI and checks read without a token on 127.0.0.1 (the
        # default, authorized reads, needs one).
        "http": {"auth": {"reads": "open"}},
        "breaker": {"max_fraction": t.breaker_max_fraction},
        "reconciler": {"resync_interval_s": t.resync_interval_s},
        "idle": {
            "window_s": t.idle_window_s,
            "evaluate_interval_s": t.idle_evaluate_s,
            "max_gap_s": t.idle_max_gap_s,
            "annotate": True,
        },
        # The loop with GPU resets only (reboots and escalations stay with people here).
        "remediation": {
            "enabled": True,
            "reset_gpu": {"enabled": True, "retry_s": t.remediation_poll_s, "order_timeout_s": 10},
            "drain": {"retry_s": t.remediation_poll_s, "timeout_s": 60},
            "validation": {"soak_s": t.remediation_soak_s, "report_grace_s": 10, "timeout_s": 60},
            "undelivered_retry_s": t.remediation_poll_s,
            "quarantine_check_s": 0.5,
            "resync_s": t.remediation_poll_s,
        },
    }


def _write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(msgspec.to_builtins(doc), sort_keys=False))
    return path


@dataclass
class Launched:
    name: str
    proc: ManagedProcess
    url: str
    """Base URL of its HTTP server."""


def start_controller(workdir: Path, kubeconfig: Path, timings: DemoTimings) -> Launched:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    config = _write_yaml(
        workdir / "controller.yaml", controller_config(timings, listen, kubeconfig)
    )
    argv = [*_module_argv("gpuhealth.controller.cli"), "--config", str(config)]
    proc = ManagedProcess("gpuhealth-controller", argv, workdir / "controller.log", REPO_ROOT)
    proc.start()
    return Launched("controller", proc, f"http://{listen}")


def start_agent(
    workdir: Path,
    node: str,
    *,
    scenario: dict[str, Any],
    token_file: Path,
    controller_url: str,
    podresources_socket: Path,
    timings: DemoTimings,
) -> Launched:
    base = workdir / "agents" / node
    scenario_file = _write_yaml(base / "scenario.yaml", scenario)
    config = _write_yaml(base / "agent.yaml", agent_config(timings))
    port = free_port()
    ws = controller_url.replace("http://", "ws://", 1) + "/v1/stream"
    argv = [
        *_module_argv("gpuhealth.agent.cli"),
        "--config", str(config),
        "--node-name", node,
        "--source", "sim",
        "--sim-scenario", str(scenario_file),
        "--kmsg-path", "none",
        "--listen", f"127.0.0.1:{port}",
        "--controller-url", ws,
        "--token-file", str(token_file),
        "--state-dir", str(base / "state"),
        "--podresources-socket", str(podresources_socket),
    ]  # fmt: skip
    proc = ManagedProcess(f"agent-{node}", argv, base / "agent.log", REPO_ROOT)
    proc.start()
    return Launched(node, proc, f"http://127.0.0.1:{port}")


async def wait_http(launched: Launched, path: str, timeout_s: float) -> None:
    """Until ``path`` answers 200; fails early (with the log tail) if the process died."""
    probe = http_probe(launched.url + path, request_timeout_s=1.0)
    await launched.proc.wait_ready_async(probe, ProbeSettings(timeout_s=timeout_s, interval_s=0.2))


async def stop_all(procs: list[ManagedProcess], grace_s: float) -> None:
    """Stop every process at once (SIGTERM, grace, SIGKILL of its group)."""
    await asyncio.gather(*(asyncio.to_thread(p.stop, grace_s) for p in procs))
