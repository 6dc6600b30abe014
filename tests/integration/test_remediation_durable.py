"""Quarantine is durable and escalated means stopped, through the real processes (controller +
one agent per node, simulated GPUs, the real API server):

- a controller restarted with the loop off keeps an escalated node's quarantine taint and RMA
  label (the episodes are read whatever ``remediation.enabled`` says);
- an operator removing the quarantine taint by hand, or excluding the node, aborts the
  episode: Failed (QuarantineRemoved / Excluded), a Warning Event, no reset, no eviction, the
  taint not put back;
- an escalation (the validation's diagnostic fails) followed by a recurrence of the fault starts
  no second episode and no second reset, and the node is quiet afterwards: its Node object is
  not written once during a 30 s watch (the measure of docs/remediation.md "Escalations");
- two escalated episodes of one node with different reasons (as an earlier version left
  them) do not fight over the RMA label: the Node is not written during a 30 s watch (the
  code before wrote it about 4,000 times a minute).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kubernetes_asyncio import client, watch

from gpuhealth.controller.kube.rest import MERGE_PATCH, request
from gpuhealth.controller.remediation.episode_store import GPURemediationStore
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import Phase, initial_status
from localkube import ControlPlane
from localkube.objects import create_gpu_node, create_namespace, pod_body
from tests.integration.remediation_helpers import quick, xid48
from tests.integration.remediation_procs import QUARANTINE, XID48, Loop, scenario
from tests.support.wait import until

pytestmark = pytest.mark.integration

RMA = "gpuhealth.io/rma"
UNHEALTHY = "gpuhealth.io/unhealthy"
STATE = "gpuhealth.io/state"
APPLIED = "gpuhealth.io/applied-taints"
ACKNOWLEDGED = "gpuhealth.io/acknowledged-taints"
EXCLUDE = "node-restriction.kubernetes.io/gpuhealth.io-exclude"
FAILING_DIAG = ("sh", "-c", "echo 'Diagnostic: Memory test FAIL on GPU 1'; exit 226")
QUIET_S = 30.0


@pytest.fixture
def loop(
    control_plane: ControlPlane, api_client: client.ApiClient, tmp_path: Path, unique_name: Any
) -> Iterator[Loop]:
    harness = Loop(control_plane.kubeconfig, api_client, tmp_path, unique_name("lease"))
    yield harness
    harness.stop()


def agent_log(loop: Loop, node: str) -> str:
    return (loop.tmp / f"agent-{node}.log").read_text()


async def node_episodes(loop: Loop, node: str) -> list[dict[str, Any]]:
    return [e for e in await loop.episodes() or [] if e["spec"]["nodeName"] == node]


def phase_of(ep: dict[str, Any]) -> str:
    return str((ep.get("status") or {}).get("phase", ""))


async def escalated(loop: Loop, node: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        eps = [e for e in await node_episodes(loop, node) if phase_of(e) == "Escalated"]
        labels = (await loop.core.read_node(node)).metadata.labels or {}
        return eps[0] if eps and labels.get(RMA) else None

    try:
        return await until(check, "the episode Escalated with the RMA label", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc


def failing_validation(loop: Loop, node: str, faults: tuple[dict[str, Any], ...]) -> None:
    loop.start_controller({"validation": {"diagnostic": True}})
    loop.start_agent(
        node,
        scenario(*faults),
        {"remediation": {"validation": {"diagnostic_command": list(FAILING_DIAG)}}},
    )


async def leads(loop: Loop, index: int) -> None:
    """Controller ``index`` leads and its reconciler has started."""
    log = loop.tmp / f"controller-{index}.log"
    await until(
        lambda: log.exists() and "leader_work_starting" in log.read_text(),
        f"controller {index} leading",
        timeout_s=30,
    )


async def node_writes(api: client.ApiClient, node: str, seconds: float) -> list[str]:
    """Every write to the Node during ``seconds``: a watch from its current resourceVersion;
    each event is one new resourceVersion (what changed, for the message)."""
    core = client.CoreV1Api(api)
    current = await core.read_node(node)
    seen: list[str] = []
    before = current
    w = watch.Watch()

    async def follow() -> None:
        nonlocal before
        async for ev in w.stream(
            core.list_node,
            field_selector=f"metadata.name={node}",
            resource_version=current.metadata.resource_version,
            timeout_seconds=int(seconds) + 5,
        ):
            obj = ev["object"]
            changed = [
                part
                for part, a, b in (
                    ("labels", before.metadata.labels, obj.metadata.labels),
                    ("annotations", before.metadata.annotations, obj.metadata.annotations),
                    ("taints", before.spec.taints, obj.spec.taints),
                    ("conditions", before.status.conditions, obj.status.conditions),
                )
                if a != b
            ]
            seen.append(f"{ev['type']} rv={obj.metadata.resource_version} {changed}")
            before = obj

    task = asyncio.create_task(follow())
    await asyncio.sleep(seconds)
    w.stop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_a_controller_restarted_with_the_loop_off_keeps_the_escalated_quarantine(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-off")
    await create_gpu_node(api_client, node, gpus=2, kwok=False)
    await loop.prepare([node])
    failing_validation(loop, node, XID48)
    before = await escalated(loop, node)
    assert QUARANTINE in await loop.taint_keys(node)

    loop.controllers[-1].stop(5.0)  # the operator turns the loop off: a new controller
    loop.start_controller({"enabled": False})
    await leads(loop, 1)
    # Proof that the new controller's reconciler has planned the node: a label it manages,
    # removed by hand, is back (the quarantine is decided in the same plan).
    await request(
        api_client,
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"metadata": {"labels": {STATE: None}}},
        content_type=MERGE_PATCH,
    )

    async def reconciled() -> bool:
        return STATE in ((await loop.core.read_node(node)).metadata.labels or {})

    await until(reconciled, "the reconciler restoring its state label", timeout_s=30)
    assert QUARANTINE in await loop.taint_keys(node), loop.logs()
    labels = (await loop.core.read_node(node)).metadata.labels or {}
    assert labels.get(RMA) == "validation-failed"
    (after,) = await node_episodes(loop, node)
    assert after["status"] == before["status"]  # read, never written, with the loop off
    taints = (await loop.core.read_node(node)).spec.taints or []
    assert [t.value for t in taints if t.key == QUARANTINE] == ["escalated"]


async def remove_quarantine_by_hand(api: client.ApiClient, node: str) -> None:
    obj = await request(api, "GET", f"/api/v1/nodes/{node}")
    taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != QUARANTINE]
    body = {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "spec": {"taints": taints},
    }
    await request(api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)


async def exclude(api: client.ApiClient, node: str) -> None:
    body = {"metadata": {"labels": {EXCLUDE: "true"}}}
    await request(api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)


@pytest.mark.parametrize(
    ("take_back", "reason"),
    [(remove_quarantine_by_hand, "QuarantineRemoved"), (exclude, "Excluded")],
    ids=["taint-removed-by-hand", "node-excluded"],
)
async def test_an_operator_taking_the_quarantine_away_aborts_the_episode(
    loop: Loop,
    api_client: client.ApiClient,
    unique_name: Any,
    take_back: Callable[[client.ApiClient, str], Awaitable[None]],
    reason: str,
) -> None:
    node = unique_name("rem-back")
    await create_gpu_node(api_client, node, gpus=2)
    namespace = unique_name("train")
    await create_namespace(api_client, namespace)
    body = pod_body("trainer", node_name=node, gpus=1)
    await client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)
    await loop.prepare([node])
    # The trainer may run on for 60 s: the episode holds at Draining, quarantined.
    rules = [{"namespaces": [namespace], "mode": "wait", "wait_s": 60, "grace_period_s": 0}]
    loop.start_controller({"drain": {"rules": rules, "timeout_s": 300}})
    loop.start_agent(node, scenario(*XID48))

    async def draining() -> bool:
        p = await loop.phase(node)
        return p is not None and p[0] == "Draining" and QUARANTINE in await loop.taint_keys(node)

    try:
        await until(draining, "the episode Draining, the node quarantined", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    await take_back(api_client, node)

    async def aborted() -> tuple[str, str] | None:
        p = await loop.phase(node)
        return p if p is not None and p[0] == "Failed" else None

    try:
        phase = await until(aborted, "the episode aborted", timeout_s=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    assert phase == ("Failed", reason)

    async def warning() -> bool:
        events = await loop.core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.name={node}"
        )
        return any(e.type == "Warning" and e.reason == "RemediationAborted" for e in events.items)

    await until(warning, "a Warning Event on the node", timeout_s=30)

    async def let_go() -> bool:  # the reconciler no longer wants (nor acknowledges) the taint
        notes = (await loop.core.read_node(node)).metadata.annotations or {}
        return not any(QUARANTINE in notes.get(k, "") for k in (APPLIED, ACKNOWLEDGED))

    await until(let_go, "the reconciler letting the quarantine go", timeout_s=30)
    assert QUARANTINE not in await loop.taint_keys(node)
    assert '"gpu_reset"' not in agent_log(loop, node)
    trainer = await client.CoreV1Api(api_client).read_namespaced_pod("trainer", namespace)
    assert trainer.metadata.deletion_timestamp is None  # never evicted
    (ep,) = await node_episodes(loop, node)
    assert not ep["status"].get("evictedPods")


RECURRENCE = {"at": 45, "gpu": 1, "xid": 48, "message": "An uncorrectable double bit error"}
"""The same fault again, well after the first episode escalated."""


async def test_an_escalation_stops_the_loop_and_the_node_stays_quiet(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-esc")
    await create_gpu_node(api_client, node, gpus=2, kwok=False)  # nothing else writes it
    await loop.prepare([node])
    failing_validation(loop, node, (*XID48, RECURRENCE))
    await escalated(loop, node)
    assert agent_log(loop, node).count('"gpu_reset"') == 1

    async def recurred() -> bool:  # the reset cleared the GPU; the recurrence taints it again
        return UNHEALTHY in await loop.taint_keys(node)

    try:
        await until(recurred, "the recurrence reported and tainted", timeout_s=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    await asyncio.sleep(5)  # the controller has seen it (a pass per change, a runner resync)

    writes = await node_writes(api_client, node, QUIET_S)
    assert writes == [], f"{len(writes)} Node writes in {QUIET_S:g} s: {writes}"
    eps = await node_episodes(loop, node)
    assert len(eps) == 1, [(e["metadata"]["name"], e["status"].get("phase")) for e in eps]
    assert eps[0]["status"]["phase"] == "Escalated"
    assert agent_log(loop, node).count('"gpu_reset"') == 1  # no second reset
    labels = (await loop.core.read_node(node)).metadata.labels or {}
    assert labels.get(RMA) == "validation-failed"
    assert QUARANTINE in await loop.taint_keys(node)


async def test_two_escalated_episodes_of_one_node_do_not_fight_over_the_rma_label(
    loop: Loop, api_client: client.ApiClient, unique_name: Any
) -> None:
    node = unique_name("rem-two")
    await create_gpu_node(api_client, node, gpus=2, kwok=False)
    await loop.prepare([node])
    store = GPURemediationStore(api_client)
    now = datetime.now(UTC)
    for hours, reason in ((1, "ValidationFailed"), (2, "RepeatedFaults")):
        detected = now - timedelta(hours=hours)
        gpu = GpuFacts(uuid="GPU-1", index=0, state="unhealthy", conditions=(xid48(detected),))
        facts = NodeFacts(name=node, boot_id="b1", gpus=(gpu,))
        spec = expected_spec(
            node, "b1", failed_gpus(facts), detected_at=detected, history=(), settings=quick()
        )
        assert spec is not None
        ep = await store.create(episode_name(node, spec.fault.fingerprint), spec, {})
        assert ep is not None
        st = initial_status(detected)
        times = msgspec.structs.replace(st.times, quarantined=detected, escalated=detected)
        await store.write_status(
            ep, msgspec.structs.replace(st, phase=Phase.ESCALATED, reason=reason, times=times)
        )
    loop.start_agent(node, scenario())  # a healthy agent: nothing new starts
    loop.start_controller()

    async def settled() -> bool:
        labels = (await loop.core.read_node(node)).metadata.labels or {}
        return bool(labels.get(RMA)) and QUARANTINE in await loop.taint_keys(node)

    try:
        await until(settled, "the RMA label and the quarantine on the node", timeout_s=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{loop.logs()}") from exc
    await asyncio.sleep(3)  # the passes the first writes caused
    writes = await node_writes(api_client, node, QUIET_S)
    assert writes == [], f"{len(writes)} Node writes in {QUIET_S:g} s: {writes[:5]}"
