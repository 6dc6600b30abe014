"""Fleet-level incidents against the real API server (docs/operations.md "Incidents"): the
controller's own configuration and RBAC, real Jobs and their pods on kwok GPU nodes, the
agents' messages through the stream server's sink (the incident judge in front of the fleet).

Measured and printed (``-s``): false taints and incidents for each storm shape, and the time
from the last report to the incident."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.kube.rest import NotFoundError, request
from gpuhealth.controller.stream.session import IngestSink
from gpuhealth.protocol import Condition, Event
from localkube import ControlPlane
from tests.integration.controller_helpers import (
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    gpu_condition,
    our_taints,
)
from tests.support.protocol import allocation, gpu_uuid, hello, next_seq, snapshot, transition
from tests.support.wait import until

pytestmark = pytest.mark.integration

REPEATED = Condition(
    reason="XidRepeated",
    code="xid-repeated",
    severity="degraded",
    action="RUN_DIAGNOSTICS",
    message="5 bursts of application XIDs within 3600 s (last: 13)",
    xid=13,
)


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def judge_of(ctl: Controller) -> IncidentJudge:
    """The stream server's sink: the incident judge in front of the fleet (the wiring under
    test; agents' messages enter here)."""
    sink: IngestSink = ctl.parts.stream.sink
    assert isinstance(sink, IncidentJudge)
    assert ctl.parts.incidents is not None and sink is ctl.parts.incidents.judge
    return sink


def xid_event(node: str, xid: int, index: int = 0, detail: str = "") -> Event:
    return Event(
        detail=detail,
        seq=next_seq(),
        node=node,
        at=datetime.now(UTC),
        kind="xid",
        gpu_uuid=gpu_uuid(index, node),
        gpu_index=index,
        previous="healthy",
        current="healthy",
        xid=xid,
    )


async def create_job(kube: Cluster, ns: str, name: str, pods: Sequence[tuple[str, str]]) -> str:
    """A batch/v1 Job (suspended: no controller manager runs here) and its pods, bound to
    their nodes, owned by the Job as the Job controller would own them; the Job's UID."""
    job = await request(
        kube.api,
        "POST",
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        body={
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "suspend": True,
                "parallelism": len(pods),
                "completions": len(pods),
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    }
                },
            },
        },
    )
    uid = str(job["metadata"]["uid"])
    await add_pods(kube, ns, name, uid, pods)
    return uid


async def add_pods(
    kube: Cluster, ns: str, name: str, uid: str, pods: Sequence[tuple[str, str]]
) -> None:
    """Pods of Job ``name`` (``uid``) bound to their nodes: a Job's next attempt (new pods,
    the same owner), as the Job controller would create them."""
    for pod, node in pods:
        await request(
            kube.api,
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "labels": {
                        "batch.kubernetes.io/job-name": name,
                        "batch.kubernetes.io/controller-uid": uid,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": name,
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )


async def events_about(kube: Cluster, ns: str, kind: str, name: str) -> list[dict[str, Any]]:
    data = await request(
        kube.api,
        "GET",
        f"/api/v1/namespaces/{ns}/events",
        query=[("fieldSelector", f"involvedObject.kind={kind},involvedObject.name={name}")],
    )
    return list(data.get("items") or [])


async def delete_namespace(kube: Cluster, ns: str) -> None:
    with suppress(NotFoundError):
        await request(kube.api, "DELETE", f"/api/v1/namespaces/{ns}")


def judged(judge: IncidentJudge) -> int:
    return sum(judge.stats.reports.values())


def metrics_text(ctl: Controller) -> str:
    return generate_latest(ctl.parts.registry).decode()


async def test_sixteen_node_job_crash_taints_nothing_and_is_one_job_incident(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("ml")
    await kube.namespace(ns)
    try:
        nodes = [await kube.node(unique_name(f"gpu{i}"), gpus=1, kwok=True) for i in range(16)]
        pods = [(f"train-{i}", node) for i, node in enumerate(nodes)]
        job_uid = await create_job(kube, ns, "train", pods)
        ctl = await kube.controller()
        judge = judge_of(ctl)
        for i, node in enumerate(nodes):
            judge.on_connect(node, hello(node, 1))
            judge.on_message(
                node,
                snapshot(
                    node, 1, allocations=[allocation(gpu_uuid(0, node), f"train-{i}", namespace=ns)]
                ),
            )

        def reported() -> bool:
            recs = [ctl.parts.fleet.node(n) for n in nodes]
            return all(r is not None and r.has_snapshot for r in recs)

        await until(reported, "every snapshot in the fleet")
        await kube.settle(ctl)

        # The job crashes everywhere: XID 13 per SM line, then the abort; the agents, seeing
        # the job crash-loop, also escalate on their own (xid-repeated).
        for node in nodes:
            for _ in range(3):
                judge.on_message(node, xid_event(node, 13))
            judge.on_message(node, xid_event(node, 43))
            judge.on_message(node, transition(node, 0, "degraded", REPEATED))
        last_report = time.monotonic()
        book = ctl.parts.incidents.book if ctl.parts.incidents else None
        assert book is not None
        await until(lambda: book.list(kind="job"), "a job incident", timeout_s=15)
        delay_s = time.monotonic() - last_report
        await until(lambda: judge.stats.events_written, "the job incident's Events written")
        await kube.settle(ctl)

        incidents = book.list()
        # One incident for the one job (XID 13 where it faulted, 43 where it was stopped):
        # no GPU blamed, nothing else.
        [fault] = incidents
        assert fault.kind == "job" and fault.decision == "no taint"
        assert fault.key == f"{ns}/Job/train" and fault.xid_class == "app-abort,app-fault"
        assert fault.subjects.owner == f"{ns}/Job/train" and len(fault.subjects.nodes) == 16
        assert fault.evidence == {"nodes": 16, "gpus": 16, "reports": 64}
        assert judge.blamed() == {}

        tainted = []
        for node in nodes:
            n = await get_node(kube.api, node)
            cond = gpu_condition(n)
            if our_taints(n):
                tainted.append(node)
            assert cond is not None and cond["status"] == "True", cond
            assert n["metadata"]["labels"][f"{PREFIX}/state"] == "healthy"
        assert tainted == []

        async def job_event() -> list[dict[str, Any]] | None:
            got = await events_about(kube, ns, "Job", "train")
            return [e for e in got if e["reason"] == "GPUJobIncident"] or None

        [event] = (await until(job_event, "the Warning Event on the Job"))[:1]
        assert event["type"] == "Warning" and event["involvedObject"]["uid"] == job_uid
        assert "16 nodes" in event["message"]
        assert any(
            e["reason"] == "GPUJobIncident" for e in await events_about(kube, ns, "Pod", "train-0")
        )
        text = metrics_text(ctl)
        assert 'gpuhealth_incidents_open{kind="job"} 1.0' in text
        assert 'gpuhealth_incidents_open{kind="gpu"} 0.0' in text
        print(
            f"\n[incidents] 16-node job crash: false taints {len(tainted)}, incidents "
            f"{[(i.kind, i.xid_class) for i in incidents]}, last report -> incident "
            f"{delay_s * 1000:.0f} ms"
        )
    finally:
        await delete_namespace(kube, ns)


async def test_one_gpu_failing_under_three_jobs_is_blamed(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("ml")
    await kube.namespace(ns)
    try:
        bad = await kube.node(unique_name("bad"), gpus=2, kwok=True)
        for job in ("a", "b", "c"):
            await create_job(kube, ns, job, [(f"{job}-0", bad)])
        ctl = await kube.controller()
        judge = judge_of(ctl)
        judge.on_connect(bad, hello(bad, 2))
        last_report = 0.0
        for k, job in enumerate(("a", "b", "c")):
            allocs = [allocation(gpu_uuid(0, bad), f"{job}-0", namespace=ns)]
            judge.on_message(bad, snapshot(bad, 2, allocations=allocs))
            judge.on_message(bad, xid_event(bad, 31))
            last_report = time.monotonic()
            await until(lambda k=k: judged(judge) > k, "the report judged")
            if job != "c":
                assert judge.blamed() == {}
        assert ctl.parts.incidents is not None
        book = ctl.parts.incidents.book
        await until(lambda: book.list(kind="gpu"), "the GPU blamed")
        delay_s = time.monotonic() - last_report

        async def tainted() -> dict[str, Any] | None:
            # the condition goes through nodes/status after the taint (lower priority): both
            n = await get_node(kube.api, bad)
            cond = gpu_condition(n)
            return n if our_taints(n) and cond is not None and cond["status"] == "False" else None

        n = await until(tainted, "the blamed GPU's node tainted and its condition False")
        assert our_taints(n) == [(UNHEALTHY, "gpu-blamed", "NoSchedule")]
        cond = gpu_condition(n)
        assert cond is not None and cond["status"] == "False" and cond["reason"] == "GpuBlamed"
        assert "GPU 0" in cond["message"]
        [inc] = book.list()
        assert inc.kind == "gpu" and inc.subjects.gpus == (f"{bad}/{gpu_uuid(0, bad)}",)
        assert inc.decision == "gpu blamed: unhealthy + diagnostic"
        assert inc.evidence["jobs"] == 3 and [i.kind for i in book.list(kind="job")] == []
        g = ctl.parts.fleet.node_health(bad).gpus[0]
        assert g.state == "unhealthy" and g.conditions[-1].action == "RUN_DIAGNOSTICS"
        assert ctl.parts.fleet.node_health(bad).gpus[1].state == "healthy"
        print(
            f"\n[incidents] one GPU under 3 jobs: incidents {[i.kind for i in book.list()]}, "
            f"taints {our_taints(n)}, last report -> blame {delay_s * 1000:.0f} ms"
        )
    finally:
        await delete_namespace(kube, ns)


XID31_TEXT = (
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f1b_6e000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
)
ATTEMPTS = {"incidents": {"judge": {"attempt_gap_s": 1.0, "first_fault_margin_s": 0.2}}}
"""Attempts a second apart (a real restart takes minutes): the test waits 1.5 s between."""


@pytest.mark.parametrize("podresources", ["up", "down"])
async def test_a_sixteen_node_job_restarting_over_one_faulting_gpu(
    kube: Cluster, unique_name: Callable[[str], str], podresources: str
) -> None:
    """A 16-node Job (2 GPUs a node, new pods each attempt, the same Job) whose node-3 GPU 1
    raises XID 31 on every attempt, after which every rank aborts with XID 43; three attempts.
    PodResources up: one job incident naming the first fault of each attempt, node-3 soft
    tainted (suspected) after the second, hard (blamed, stored for a successor) after the
    third, no other node tainted. PodResources down (the agents say so): no incident, no
    taint anywhere, each node's record says why."""
    ns = unique_name("ml")
    await kube.namespace(ns)
    try:
        nodes = [await kube.node(unique_name(f"gpu{i}"), gpus=2, kwok=True) for i in range(16)]
        bad_node, bad_gpu = nodes[3], gpu_uuid(1, nodes[3])
        uid = await create_job(kube, ns, "train", [])
        ctl = await kube.controller(ATTEMPTS)
        judge = judge_of(ctl)
        assert ctl.parts.incidents is not None
        book = ctl.parts.incidents.book
        why = "PodResources: PodResources socket /var/lib/kubelet/pod-resources/kubelet.sock "
        why += "does not exist"
        for node in nodes:
            judge.on_connect(node, hello(node, 2))
        soft = (f"{PREFIX}/degraded", "gpu-suspected", "PreferNoSchedule")
        hard = (UNHEALTHY, "gpu-blamed", "NoSchedule")
        for k in range(3):
            pods = [(f"train-a{k}-{i}", node) for i, node in enumerate(nodes)]
            await add_pods(kube, ns, "train", uid, pods)
            for i, node in enumerate(nodes):
                allocs = [
                    allocation(gpu_uuid(g, node), f"train-a{k}-{i}", namespace=ns) for g in (0, 1)
                ]
                snap = snapshot(node, 2, allocations=allocs)
                if podresources == "down":
                    snap = msgspec.structs.replace(snap, allocations=[], allocations_unknown=why)
                judge.on_message(node, snap)
            before = judged(judge)
            judge.on_message(bad_node, xid_event(bad_node, 31, 1, XID31_TEXT))
            for node in nodes:
                for g in (0, 1):
                    judge.on_message(node, xid_event(node, 43, g))
            await until(lambda b=before: judged(judge) >= b + 33, "the attempt's reports judged")
            if podresources == "up":
                [job] = await until(lambda: book.list(kind="job"), "the job incident")
                assert f"#{k + 1} {bad_node}/{bad_gpu} XID 31" in job.reason
                if k == 1:
                    n = await until(
                        lambda: _tainted_with(kube, bad_node, soft), "node-3 soft-tainted"
                    )
                    assert our_taints(n) == [soft]
                    [gpu] = book.list(kind="gpu")
                    assert gpu.blame is not None and gpu.blame.suspected
            await asyncio.sleep(1.5)  # the next attempt
        if podresources == "down":
            await kube.settle(ctl)
            assert book.list() == [] and judge.blamed() == {}
            for node in nodes:
                rec = ctl.parts.fleet.node(node)
                assert rec is not None and rec.allocations_unknown == why
                assert our_taints(await get_node(kube.api, node)) == []
            print("\n[incidents] 16-node job x3 attempts, PodResources down: 0 taints, 0 incidents")
            return
        n = await until(lambda: _tainted_with(kube, bad_node, hard), "node-3 hard-tainted")
        assert hard in our_taints(n)
        [gpu] = book.list(kind="gpu")
        assert gpu.blame is not None and not gpu.blame.suspected
        assert "the first to fault in 3 attempts" in gpu.reason

        async def stored_blame() -> dict[str, Any] | None:
            data = await request(kube.api, "GET", INCIDENTS)
            for o in data.get("items") or []:
                st = o.get("status") or {}
                if st.get("kind") == "gpu" and st.get("blame") and not st["blame"].get("suspected"):
                    return dict(st["blame"])
            return None

        blame = await until(stored_blame, "the blame stored for a successor")
        assert blame["xid"] == 31
        await kube.settle(ctl)
        tainted = [node for node in nodes if our_taints(await get_node(kube.api, node))]
        assert tainted == [bad_node]
        [job] = book.list(kind="job")
        assert job.reason.count(f"{bad_node}/{bad_gpu} XID 31") == 3
        assert job.xid_class == "app-abort,app-fault" and job.reason.startswith("XID 31, 43")
        print(
            f"\n[incidents] 16-node job x3 attempts over one GPU: tainted {len(tainted)} node, "
            f"incidents {sorted(i.kind for i in book.list())}"
        )
    finally:
        await delete_namespace(kube, ns)


async def _tainted_with(
    kube: Cluster, node: str, taint: tuple[str, str, str]
) -> dict[str, Any] | None:
    n = await get_node(kube.api, node)
    return n if taint in our_taints(n) else None


async def test_gpu_node_whose_agent_never_starts_is_reported_without_write_loops(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    lonely = await kube.node(unique_name("lonely"), gpus=8)
    watched = await kube.node(unique_name("watched"), gpus=8)
    ctl = await kube.controller(
        {"incidents": {"unwatched": {"grace_s": 1.0, "check_interval_s": 0.2}}}
    )
    judge = judge_of(ctl)
    judge.on_connect(watched, hello(watched, 2))
    judge.on_message(watched, snapshot(watched, 2))
    assert ctl.parts.incidents is not None
    book = ctl.parts.incidents.book

    async def missing() -> dict[str, Any] | None:
        n = await get_node(kube.api, lonely)
        c = gpu_condition(n)
        return n if c is not None and c["reason"] == "AgentMissing" else None

    n = await until(missing, "GPUHealthy=Unknown/AgentMissing", timeout_s=20)
    cond = gpu_condition(n)
    assert cond is not None and cond["status"] == "Unknown"
    assert n["metadata"]["labels"][f"{PREFIX}/state"] == "unknown"
    assert our_taints(n) == []  # tainting is an option, off by default
    unwatched = [i.subjects.nodes[0] for i in book.list(kind="unwatched")]
    assert lonely in unwatched and watched not in unwatched
    assert "gpuhealth_unwatched_gpu_nodes" in metrics_text(ctl)

    # A quiet fleet writes nothing: the node's resourceVersion stays put over many passes.
    await kube.settle(ctl)
    version = n["metadata"]["resourceVersion"]
    before = (await get_node(kube.api, lonely))["metadata"]["resourceVersion"]
    ticks = ctl.parts.incidents.unwatched
    for _ in range(10):
        ticks.check()
    await kube.settle(ctl)
    after = (await get_node(kube.api, lonely))["metadata"]["resourceVersion"]
    assert before == after, (version, before, after)

    # The agent arrives: the condition becomes the GPUs' verdict, the incident closes.
    judge.on_connect(lonely, hello(lonely, 2))
    judge.on_message(lonely, snapshot(lonely, 2))

    async def watched_now() -> dict[str, Any] | None:
        n = await get_node(kube.api, lonely)
        c = gpu_condition(n)
        return n if c is not None and c["status"] == "True" else None

    await until(watched_now, "GPUHealthy=True once the agent reports", timeout_s=20)
    await until(lambda: not book.find("unwatched", lonely), "the unwatched incident closed")
    print(f"\n[incidents] agent never started: reported {lonely}; quiet passes wrote nothing")


async def test_a_dra_only_node_and_an_agent_that_never_sends_its_snapshot_are_unwatched(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """A node with no GFD label and no nvidia.com/gpu capacity whose GPUs NVIDIA's DRA driver
    publishes (a ResourceSlice of ``gpu.nvidia.com``), no agent; and a GPU node whose agent
    says Hello every 0.2 s and never sends its Snapshot (crash-looping before it). Both are
    unwatched after the grace; a CPU node is not."""
    dra_only = await kube.node(
        unique_name("dra"), gpus=0, labels={"nvidia.com/gpu.present": "false"}
    )
    cpu = await kube.node(unique_name("cpu"), gpus=0, labels={"nvidia.com/gpu.present": "false"})
    looping = await kube.node(unique_name("loop"), gpus=8)
    slice_name = f"{dra_only}-gpu.nvidia.com"
    await request(
        kube.api,
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": dra_only,
                "pool": {"name": dra_only, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(4)],
            },
        },
    )
    try:
        grace = {"grace_s": 1.0, "check_interval_s": 0.2, "dra_refresh_s": 0.2}
        ctl = await kube.controller({"incidents": {"unwatched": grace}})
        judge = judge_of(ctl)
        assert ctl.parts.incidents is not None
        book = ctl.parts.incidents.book
        started = time.monotonic()

        def unwatched() -> set[str]:
            return {i.key for i in book.list(kind="unwatched")}

        while looping not in unwatched() and time.monotonic() - started < 20:
            judge.on_connect(looping, hello(looping, 8))
            judge.on_disconnect(looping)
            await asyncio.sleep(0.2)
        await until(lambda: {dra_only, looping} <= unwatched(), "both unwatched", timeout_s=20)
        assert cpu not in unwatched()
        dra_incident = book.find("unwatched", dra_only)
        assert dra_incident is not None and dra_incident.evidence["gpus"] == 4

        async def missing(node: str) -> dict[str, Any] | None:
            c = gpu_condition(await get_node(kube.api, node))
            return c if c is not None and c["reason"] == "AgentMissing" else None

        await until(lambda: missing(looping), "the looping agent's node AgentMissing")
        await until(lambda: missing(dra_only), "the DRA-only node AgentMissing")
        print(
            f"\n[incidents] DRA-only node and Hello-only agent unwatched after "
            f"{time.monotonic() - started:.1f} s (grace 1 s)"
        )
    finally:
        with suppress(NotFoundError):
            await request(
                kube.api, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name}"
            )
