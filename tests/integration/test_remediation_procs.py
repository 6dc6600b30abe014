"""The remediation loop's safety through the real processes (controller + one agent per node,
simulated GPUs, the real API server):

- the circuit breaker stops a 50 % storm: of two faulty nodes out of four, only the breaker's
  budget (one node) gets any disruptive step; the other episode waits, untouched, until an
  operator closes the breaker, and then runs;
- a failed validation (the diagnostic hook fails after the reset) escalates: phase
  Escalated, the RMA label, Warning Events, one reset and no second attempt;
- a controller killed with SIGKILL while an episode drains, and again while it validates,
  is replaced by a new process that resumes the episode from its status: it finishes once,
  with one reset, one eviction and one GPURemediation.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from localkube import ControlPlane
from localkube.objects import create_gpu_node, create_namespace, pod_body
from tests.integration.remediation_procs import QUARANTINE, XID48, Loop, scenario
from tests.support.wait import until

pytestmark = pytest.mark.integration

ACTIVE = {"Draining", "Remediating", "Validating", "Returned"}


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


def agent_log(loop: Loop, node: str) -> str:
    return (loop.tmp / f"agent-{node}.log").read_text()


async def one_episode(loop: Loop, node: str) -> dict[str, Any]:
    eps = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
    assert len(eps) == 1, f"{len(eps)} episodes for {node}"
    return eps[0]


async def test_the_breaker_stops_a_50_percent_storm(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    nodes = [unique_name(f"storm{i}") for i in range(4)]
    for n in nodes:
        await create_gpu_node(api_client, n, gpus=2)
    await loop.prepare(nodes)
    breaker_cm = f"{loop.lease}-breaker"
    # A budget of exactly one node: the API server is shared with other tests' nodes, so a
    # fraction of "the fleet" would not be a fraction of these four.
    loop.start_controller(
        breaker={"max_fraction": 0.0, "min_nodes": 1, "configmap": breaker_cm,
                 "poll_interval_s": 1},
    )  # fmt: skip
    faulty, healthy = nodes[:2], nodes[2:]
    for n in faulty:
        loop.start_agent(n, scenario(*XID48))
    for n in healthy:
        loop.start_agent(n, scenario())

    async def one_returned_one_held() -> tuple[str, str] | None:
        phases = {n: await loop.phase(n) for n in faulty}
        done = [n for n, p in phases.items() if p and p[0] == "Returned"]
        held = [n for n, p in phases.items() if p and p[0] not in ACTIVE]
        return (done[0], held[0]) if len(done) == 1 and len(held) == 1 else None

    try:
        first, held = await until(
            one_returned_one_held, "one episode Returned, the other held", timeout_s=90
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    # The held node got nothing disruptive, while the admitted one ran a whole episode.
    ep = await one_episode(loop, held)
    status = ep["status"]
    assert status["phase"] in ("Pending", "Quarantined"), status
    assert status["reason"] == "BreakerOpen", status
    assert "order" not in status and not status.get("evictedPods")
    assert "gpu_reset" not in agent_log(loop, held)
    assert QUARANTINE not in await loop.taint_keys(held)
    assert "gpu_reset" in agent_log(loop, first)
    for n in healthy:
        assert await loop.phase(n) is None

    # An operator closes the breaker (docs/operations.md): the held episode runs.
    await client.CoreV1Api(api_client).patch_namespaced_config_map(
        breaker_cm, "gpuhealth", {"data": {"state": "closed"}}
    )

    async def held_returned() -> bool:
        p = await loop.phase(held)
        return p is not None and p[0] == "Returned"

    try:
        await until(held_returned, "the held episode Returned after the reset", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    assert "gpu_reset" in agent_log(loop, held)


async def test_a_failed_validation_escalates_once(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-diag")
    await create_gpu_node(api_client, node, gpus=2)
    await loop.prepare([node])
    loop.start_controller({"validation": {"diagnostic": True}})
    diag = ("sh", "-c", "echo 'Diagnostic: Memory test FAIL on GPU 1'; exit 226")
    loop.start_agent(
        node,
        scenario(*XID48),
        {"remediation": {"validation": {"diagnostic_command": list(diag)}}},
    )

    async def escalated() -> dict[str, Any] | None:
        eps = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        if not eps or eps[0].get("status", {}).get("phase") != "Escalated":
            return None
        labels = (await loop.core.read_node(node)).metadata.labels or {}
        return eps[0] if labels.get("gpuhealth.io/rma") else None

    try:
        ep = await until(escalated, "the episode Escalated with the RMA label", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    status = ep["status"]
    assert status["reason"] == "ValidationFailed", status
    checks = {c["name"]: c for c in status["validation"]["checks"]}
    assert not checks["diagnostic"]["passed"]
    assert "Memory test FAIL" in checks["diagnostic"]["message"]
    labels = (await loop.core.read_node(node)).metadata.labels
    assert labels["gpuhealth.io/rma"] == "validation-failed"
    assert QUARANTINE in await loop.taint_keys(node)  # out of service until released

    async def warning_events() -> list[Any] | None:
        events = await loop.core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.name={node}"
        )
        found = [e for e in events.items if e.type == "Warning" and "Escalat" in e.reason]
        return found or None

    await until(warning_events, "a Warning Event on the node", timeout_s=30)
    # No loop: one reset on the node, one episode.
    assert agent_log(loop, node).count('"gpu_reset"') == 1
    await one_episode(loop, node)


async def test_a_killed_controller_resumes_the_episode_at_draining_and_validating(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-kill")
    await create_gpu_node(api_client, node, gpus=2)
    namespace = unique_name("train")
    await create_namespace(api_client, namespace)
    body = pod_body("trainer", node_name=node, gpus=1)
    await client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)
    await loop.prepare([node])
    remediation = {
        # The trainer may run on 8 s into the drain (the episode holds at Draining), and
        # the soak is long enough to kill the controller in it.
        "drain": {"rules": [{"namespaces": [namespace], "mode": "wait", "wait_s": 8,
                             "grace_period_s": 0}]},
        "validation": {"soak_s": 8},
    }  # fmt: skip
    loop.start_controller(remediation)
    loop.start_agent(node, scenario(*XID48))

    async def in_phase(phase: str) -> bool:
        p = await loop.phase(node)
        return p is not None and p[0] == phase

    async def kill_and_replace(phase: str) -> None:
        try:
            await until(lambda: in_phase(phase), f"the episode in {phase}", timeout_s=90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{loop.logs()}") from exc
        victim = loop.controllers[-1]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        await until(lambda: victim.exited() is not None, "the controller dead", timeout_s=10)
        loop.start_controller(remediation)

    await kill_and_replace("Draining")
    await kill_and_replace("Validating")

    async def returned() -> dict[str, Any] | None:
        eps = [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]
        if eps and eps[0].get("status", {}).get("times", {}).get("returned"):
            return eps[0]
        return None

    try:
        ep = await until(returned, "the episode Returned", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    status = ep["status"]
    assert status["phase"] == "Returned"
    assert [p["name"] for p in status["evictedPods"]] == ["trainer"]
    assert agent_log(loop, node).count('"gpu_reset"') == 1  # reset once, not per controller
    await one_episode(loop, node)
    assert QUARANTINE not in await loop.taint_keys(node)
    assert len(loop.controllers) == 3
