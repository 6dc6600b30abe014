"""One GPU-reset episode end to end through the real processes: the controller
(``gpuhealth.controller.cli``, remediation on) and a node's agent (``gpuhealth.agent.cli``,
simulated GPUs) against the real API server. The simulated GPU takes a double-bit ECC error
(XID 48, RESET_GPU): the controller opens a GPURemediation, quarantines the node (the taint,
through the reconciler), drains it, orders the reset over the agent stream, the agent resets
the simulated GPU (the fault's cause is gone), validates through a soak, and the controller
lifts the quarantine: Returned, with a timestamp for every phase.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from demo.cluster import agent_tokens, write_tokens
from demo.procs import REPO_ROOT
from gpuhealth.controller.remediation.model import GROUP, PLURAL, VERSION
from localkube import ControlPlane
from localkube.objects import create_gpu_node
from localkube.process import ManagedProcess, free_port
from tests.integration.remediation_helpers import install_crd
from tests.support.wait import until

pytestmark = pytest.mark.integration

QUARANTINE = "gpuhealth.io/remediation"


def controller_config(kubeconfig: Path, listen: str) -> dict[str, Any]:
    return {
        "listen": listen,
        "kubeconfig": str(kubeconfig),
        "log_format": "json",
        "breaker": {"max_fraction": 1.0},
        "reconciler": {"resync_interval_s": 5},
        "remediation": {
            "enabled": True,
            "reset_gpu": {"enabled": True, "retry_s": 1, "order_timeout_s": 5},
            "drain": {"retry_s": 1, "timeout_s": 60},
            "validation": {"soak_s": 2, "report_grace_s": 10, "timeout_s": 60},
            "safety": {"max_concurrent": 5, "max_fraction": 1.0},
            "undelivered_retry_s": 1,
            "quarantine_check_s": 0.5,
            "resync_s": 2,
        },
    }


def agent_config() -> dict[str, Any]:
    return {
        "log_format": "json",
        "tick_interval_s": 0.2,
        "stream": {"heartbeat_interval_s": 1},
        "remediation": {"enabled": True, "validation": {"check_interval_s": 0.2}},
    }


SCENARIO = {
    "name": "reset-episode",
    "gpus": 2,
    "poll_interval_s": 0.2,
    "seed": 7,
    "faults": [
        {"at": 3, "gpu": 1, "dbe": 1},
        {"at": 3, "gpu": 1, "xid": 48, "message": "An uncorrectable double bit error"},
    ],
}


@pytest.fixture
def procs() -> Iterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    yield started
    for p in reversed(started):
        p.stop(5.0)


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_a_reset_episode_runs_from_the_fault_to_returned(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    unique_name: Any,
    tmp_path: Path,
    procs: list[ManagedProcess],
) -> None:
    await install_crd(api_client)
    node = unique_name("rem-e2e")
    await create_gpu_node(api_client, node, gpus=2)
    token = write_tokens(await agent_tokens(api_client, [node]), tmp_path / "tokens")[node]
    port = free_port()
    controller = ManagedProcess(
        "controller",
        [
            *("python3", "-m", "gpuhealth.controller.cli"),
            *("--config", str(write(tmp_path / "c.yaml", controller_config(
                control_plane.kubeconfig, f"127.0.0.1:{port}")))),
        ],
        tmp_path / "controller.log",
        REPO_ROOT,
    )  # fmt: skip
    controller.argv[0] = __import__("sys").executable
    controller.start()
    procs.append(controller)
    agent = ManagedProcess(
        "agent",
        [
            __import__("sys").executable, "-m", "gpuhealth.agent.cli",
            "--config", str(write(tmp_path / "a.yaml", agent_config())),
            "--node-name", node, "--source", "sim",
            "--sim-scenario", str(write(tmp_path / "s.yaml", SCENARIO)),
            "--kmsg-path", "none", "--listen", f"127.0.0.1:{free_port()}",
            "--controller-url", f"ws://127.0.0.1:{port}/v1/stream",
            "--token-file", str(token), "--state-dir", str(tmp_path / "state"),
            "--podresources-socket", str(tmp_path / "none.sock"),
        ],
        tmp_path / "agent.log",
        REPO_ROOT,
    )  # fmt: skip
    agent.start()
    procs.append(agent)
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    seen_quarantine: list[bool] = []

    async def episode() -> dict[str, Any] | None:
        try:
            items = (await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))["items"]
        except ApiException as exc:  # the new CRD's storage may still be initializing
            if exc.status == 429:
                return None
            raise
        mine = [i for i in items if i["spec"]["nodeName"] == node]
        taints = (await core.read_node(node)).spec.taints or []
        if any(t.key == QUARANTINE for t in taints):
            seen_quarantine.append(True)
        if mine and mine[0].get("status", {}).get("phase") == "Returned":
            times = mine[0]["status"].get("times", {})
            return mine[0] if times.get("returned") else None
        return None

    def logs() -> str:
        return f"controller:\n{controller.log_tail(40)}\nagent:\n{agent.log_tail(40)}"

    try:
        ep = await until(episode, "the episode Returned", timeout_s=90, interval_s=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from exc
    assert ep["spec"]["action"] == "reset-gpu"
    times = ep["status"]["times"]
    for stage in ("detected", "quarantined", "drained", "remediated", "validated", "returned"):
        assert times.get(stage), f"no {stage} time: {times}"
    assert ep["status"]["order"]["state"] == "succeeded"
    assert seen_quarantine, "the node never carried the quarantine taint"
    taints = (await core.read_node(node)).spec.taints or []
    assert not any(t.key == QUARANTINE for t in taints)
    log = (tmp_path / "agent.log").read_text()
    assert "gpu_reset" in log
