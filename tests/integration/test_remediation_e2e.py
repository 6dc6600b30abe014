"""Episodes end to end through the real processes: the controller (``gpuhealth.controller.cli``,
remediation on) and a node's agent (``gpuhealth.agent.cli``, simulated GPUs) against the real
API server.

- Reset: the simulated GPU takes a double-bit ECC error (XID 48, RESET_GPU): the controller
  opens a GPURemediation, quarantines the node (the taint, through the reconciler), drains it,
  orders the reset over the agent stream, the agent resets the simulated GPU (the fault's
  cause is gone), validates through a soak, and the controller lifts the quarantine:
  Returned, with a timestamp for every phase.
- Reboot: the GPU falls off the bus (XID 79, RESTART_BM). The episode waits for the
  operator's approval annotation, then the agent's reboot executor reboots the simulated node:
  the agent process starts again with a new boot id, the fault is gone, the controller sees
  the new boot id, validates and returns the node.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from localkube import ControlPlane
from localkube.objects import create_gpu_node
from tests.integration.remediation_procs import QUARANTINE, XID48, XID79, Loop, scenario
from tests.support.wait import until

pytestmark = pytest.mark.integration

STAGES = ("detected", "quarantined", "drained", "remediated", "validated", "returned")


@pytest.fixture
def loop(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tmp_path: Path,
    unique_name: Any,
) -> Iterator[Loop]:
    harness = Loop(control_plane.kubeconfig, api_client, tmp_path, unique_name("lease"))
    yield harness
    harness.stop()


async def returned(loop: Loop, node: str, seen_quarantine: list[bool]) -> dict[str, Any] | None:
    eps = await loop.episodes()
    if QUARANTINE in await loop.taint_keys(node):
        seen_quarantine.append(True)
    mine = [e for e in eps or [] if e["spec"]["nodeName"] == node]
    if mine and mine[0].get("status", {}).get("phase") == "Returned":
        return mine[0] if mine[0]["status"].get("times", {}).get("returned") else None
    return None


async def test_a_reset_episode_runs_from_the_fault_to_returned(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-e2e")
    await create_gpu_node(api_client, node, gpus=2)
    await loop.prepare([node])
    loop.start_controller()
    loop.start_agent(node, scenario(*XID48))
    seen_quarantine: list[bool] = []
    try:
        ep = await until(
            lambda: returned(loop, node, seen_quarantine),
            "the episode Returned",
            timeout_s=90,
            interval_s=0.2,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    assert ep["spec"]["action"] == "reset-gpu"
    times = ep["status"]["times"]
    for stage in STAGES:
        assert times.get(stage), f"no {stage} time: {times}"
    assert ep["status"]["order"]["state"] == "succeeded"
    assert seen_quarantine, "the node never carried the quarantine taint"
    assert QUARANTINE not in await loop.taint_keys(node)
    log = (loop.tmp / f"agent-{node}.log").read_text()
    assert "gpu_reset" in log
    # `gpuhealth-controller status` shows the episode, read from the running controller.
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gpuhealth.controller.cli", "status",
         "--url", f"http://127.0.0.1:{loop.port}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert any(line.startswith("remediation: Pending 0 ") for line in lines), out.stdout
    head = next(line for line in lines if line.startswith("NODE  ") and "EVICTED" in line)
    row = next(line for line in lines if line.startswith(node) and "Returned" in line)
    assert row.split()[:3] == [node, "Returned", "reset-gpu"]
    assert row.index("Returned") == head.index("PHASE")


async def test_a_reboot_episode_waits_for_approval_then_reboots_and_returns(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-boot")
    await create_gpu_node(api_client, node, gpus=2)
    await loop.prepare([node])
    loop.start_controller({"reboot": {"approval_required": True}})
    agent = loop.start_agent(node, scenario(*XID79))

    async def awaiting_approval() -> str | None:
        eps = await loop.episodes() or []
        mine = [e for e in eps if e["spec"]["nodeName"] == node]
        if mine and mine[0].get("status", {}).get("reason") == "AwaitingApproval":
            return str(mine[0]["metadata"]["name"])
        return None

    try:
        name = await until(awaiting_approval, "the reboot awaits approval", timeout_s=60)
        # Nothing disruptive before the approval: no quarantine (the wait holds no
        # concurrency slot), no order went out, nothing drained.
        (ep,) = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        assert ep["spec"]["action"] == "reboot"
        assert ep["status"]["phase"] == "Pending"
        assert "order" not in ep["status"]
        assert "gpuhealth.io/remediation" not in await loop.taint_keys(node)
        boot_before = ep["spec"]["fault"]["bootId"]
        await loop.annotate(name, "gpuhealth.io/approve", "on-call: reboot ok")
        seen_quarantine: list[bool] = []
        ep = await until(
            lambda: returned(loop, node, seen_quarantine),
            "the reboot episode Returned",
            timeout_s=90,
            interval_s=0.2,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    status = ep["status"]
    for stage in STAGES:
        assert status["times"].get(stage), f"no {stage} time: {status['times']}"
    assert status["approvedBy"] == "on-call: reboot ok"
    assert status["bootIdBefore"] == boot_before
    assert QUARANTINE not in await loop.taint_keys(node)
    log = (loop.tmp / f"agent-{node}.log").read_text()
    assert "sim_node_rebooting" in log
    assert log.count("agent_started") == 2, "the agent did not start again after the reboot"
    assert agent.exited() is None  # the same process, re-executed
    new_boot = (loop.tmp / f"state-{node}" / "sim-boot.json").read_text()
    assert boot_before not in new_boot
    # One episode, not a second one for the rebooted node's (gone) fault.
    assert len([e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]) == 1


async def test_an_abort_cancels_a_reboot_in_its_delay_and_holds_the_node(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    """Through the real processes: a reboot order the agent accepted and is waiting out
    (reboot.delay_s) when an operator aborts the episode: the controller sends the cancel,
    the agent stops the reboot and answers it (the cancel's report in the status), the node
    never reboots, keeps its quarantine, and the fault still reported starts no new episode
    until the aborted one is released or deleted."""
    node = unique_name("rem-abort")
    await create_gpu_node(api_client, node, gpus=2)
    await loop.prepare([node])
    loop.start_controller({"reboot": {"approval_required": False}})
    loop.start_agent(node, scenario(*XID79), {"remediation": {"reboot": {"delay_s": 60}}})

    async def order(state: str, action: str) -> dict[str, Any] | None:
        eps = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        status = eps[0].get("status", {}) if eps else {}
        got = status.get("order") or {}
        return eps[0] if got.get("action") == action and got.get("state") == state else None

    try:
        ep = await until(lambda: order("accepted", "reboot"), "the reboot accepted", timeout_s=90)
        name = ep["metadata"]["name"]
        await loop.annotate(name, "gpuhealth.io/abort", "wrong node, do not reboot")
        ep = await until(
            lambda: order("succeeded", "cancel"), "the agent's answer to the cancel", timeout_s=60
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    status = ep["status"]
    assert status["phase"] == "Failed" and status["reason"] == "Aborted"
    assert status["order"]["id"].endswith("-reboot-1-cancel")
    log = (loop.tmp / f"agent-{node}.log").read_text()
    assert "remediation_order_cancelled" in log and "sim_node_rebooting" not in log
    assert not (loop.tmp / f"state-{node}" / "sim-boot.json").exists()  # never rebooted
    assert QUARANTINE in await loop.taint_keys(node)  # kept: the operator decides
    # the fault is still reported, but the aborted episode holds the node: no second one
    for _ in range(10):
        await asyncio.sleep(0.5)
        mine = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        assert len(mine) == 1, [e["metadata"]["name"] for e in mine]
