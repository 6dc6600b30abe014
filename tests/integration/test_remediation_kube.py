"""The remediation loop's Kubernetes side against a real API server (kwok nodes and pods).

- the chart's CRD installs; the status subresource, the immutable spec, the schema, the
  printer columns and the field selector work; the store's watch cache follows;
- an eviction a PodDisruptionBudget refuses answers 429 and is retried, and the pod is
  never deleted, until the budget allows it;
- a gang (the pods of one Job, on three nodes) is evicted whole;
- a partial drain evicts only the pods on the failed GPU; DaemonSet pods stay;
- an escalation labels the node for RMA and posts Events.

PodDisruptionBudget status is computed by kube-controller-manager's disruption controller.
The tests run a real one with only that controller (``make integration`` builds it:
``hack/kube-binaries.sh --node``). Without the binary, on a developer's machine, they write
the status the way the disruption controller would (``emulate_disruption_controller``), so
the API server's own eviction check is exercised either way; under ``CI=true`` a missing
kube-controller-manager fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgspec
import pytest
from kubernetes_asyncio import client

from gpuhealth.controller.kube.rest import ConflictError, KubeError, request
from gpuhealth.controller.remediation.episode_store import PATH, GPURemediationStore
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts
from gpuhealth.controller.remediation.fault import (
    SHARED_DOMAIN,
    episode_name,
    expected_spec,
    failed_gpus,
)
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.settings import DrainSettings, GangSettings
from gpuhealth.controller.remediation.status import enter
from localkube import ControlPlane
from localkube.assets import AssetsMissing
from localkube.controllermanager import ControllerManager, ControllerManagerSettings
from localkube.kwok import Kwok
from localkube.objects import create_gpu_node, create_namespace
from tests.integration.remediation_helpers import (
    KEYS,
    Harness,
    alloc,
    contact_support,
    install_crd,
    quick,
    running,
    xid48,
)
from tests.integration.tooling import in_ci
from tests.support.protocol import T0
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def disruption_controller(control_plane: ControlPlane) -> Iterator[bool]:
    """True while a real kube-controller-manager runs the disruption controller; False (the
    status is emulated) when its binary is missing, which fails the run under ``CI=true``."""
    try:
        kcm = ControllerManager(
            control_plane, settings=ControllerManagerSettings(controllers="disruption")
        )
    except AssetsMissing as exc:
        if in_ci():
            pytest.fail(
                f"CI=true and kube-controller-manager is missing ({exc}); "
                "make integration builds it (hack/kube-binaries.sh --node)",
                pytrace=False,
            )
        yield False
        return
    with kcm:
        yield True


@pytest.fixture
async def crd(api_client: client.ApiClient) -> None:
    await install_crd(api_client)


@pytest.fixture
async def namespace(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> AsyncIterator[str]:
    ns = unique_name("rem")
    await create_namespace(api_client, ns)
    yield ns
    with contextlib.suppress(KubeError):
        await request(api_client, "DELETE", f"/api/v1/namespaces/{ns}")


async def make_pod(
    api: client.ApiClient,
    ns: str,
    name: str,
    node: str,
    *,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    gpus: int = 1,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owners:
        meta["ownerReferences"] = owners
    if finalizers:
        meta["finalizers"] = finalizers
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [container]},
    }
    return await request(api, "POST", f"/api/v1/namespaces/{ns}/pods", body=body)


async def pod_or_none(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return await request(api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


async def ready(api: client.ApiClient, ns: str, *names: str) -> None:
    async def all_ready() -> bool:
        for name in names:
            pod = await pod_or_none(api, ns, name)
            conds = ((pod or {}).get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                return False
        return True

    await until(all_ready, f"pods {names} ready (kwok)", timeout_s=30)


async def emulate_disruption_controller(api: client.ApiClient, ns: str, name: str) -> None:
    """EMULATION (no kube-controller-manager here): write the PDB status the disruption
    controller would compute for an integer minAvailable over plain pods: currentHealthy =
    ready, not terminating pods it selects; disruptionsAllowed = currentHealthy - minAvailable."""
    pdb = await request(api, "GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
    selector = ",".join(f"{k}={v}" for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    pods = await request(
        api, "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", selector)]
    )
    healthy = sum(
        1
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    )
    want = int(pdb["spec"]["minAvailable"])
    pdb["status"] = {
        "observedGeneration": pdb["metadata"]["generation"],
        "currentHealthy": healthy,
        "desiredHealthy": want,
        "expectedPods": len(pods["items"]),
        "disruptionsAllowed": max(0, healthy - want),
        "disruptedPods": {},
    }
    await request(
        api, "PUT", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}/status", body=pdb
    )


async def create_pdb(
    api: client.ApiClient, ns: str, name: str, min_available: int, labels: dict[str, str]
) -> str:
    """A PodDisruptionBudget over the pods with ``labels``; returns the collection's path."""
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
    }
    path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    await request(api, "POST", path, body=pdb)
    return path


async def settle_pdb(api: client.ApiClient, ns: str, name: str, allowed: int, real: bool) -> None:
    if not real:
        await emulate_disruption_controller(api, ns, name)

    async def computed() -> bool:
        pdb = await request(
            api, "GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}"
        )
        st = pdb.get("status") or {}
        up_to_date = int(st.get("observedGeneration") or 0) >= int(pdb["metadata"]["generation"])
        return up_to_date and int(st.get("disruptionsAllowed") or 0) == allowed

    await until(computed, f"PDB {name} allows {allowed}", timeout_s=30)


# ----------------------------------------------------------------------------------- the CRD


async def test_crd_status_subresource_schema_columns_and_watch(
    api_client: client.ApiClient, crd: None, unique_name: Callable[[str], str]
) -> None:
    node = unique_name("crd-node")
    facts = NodeFacts(
        name=node,
        boot_id="b1",
        gpus=(GpuFacts(uuid="GPU-1", index=0, state="unhealthy", conditions=(xid48(),)),),
    )
    spec = expected_spec(
        node, "b1", failed_gpus(facts), detected_at=T0, history=(), settings=quick()
    )
    assert spec is not None
    name = episode_name(node, spec.fault.fingerprint)
    store = GPURemediationStore(api_client)
    seen: list[str] = []
    store.subscribe(seen.append)
    ep = await store.create(name, spec, {KEYS.node_label: node})
    assert ep is not None and ep.phase is Phase.PENDING and ep.spec == spec
    assert await store.create(name, spec, {}) is None  # the same fault: no second episode

    moved = await store.write_status(ep, enter(ep.status, Phase.QUARANTINED, T0, "Admitted", "m"))
    assert moved.phase is Phase.QUARANTINED and moved.status.times.quarantined == T0
    with pytest.raises(ConflictError):  # a stale writer loses
        await store.write_status(ep, enter(ep.status, Phase.FAILED, T0, "Aborted"))

    raw = await request(api_client, "GET", f"{PATH}/{name}")
    raw["status"]["phase"] = "Returned"  # the main resource ignores status changes
    await request(api_client, "PUT", f"{PATH}/{name}", body=raw)
    again = await store.fetch(name)
    assert again is not None and again.phase is Phase.QUARANTINED
    raw = await request(api_client, "GET", f"{PATH}/{name}")
    raw["spec"]["action"] = "reboot"  # spec is immutable
    with pytest.raises(KubeError) as exc:
        await request(api_client, "PUT", f"{PATH}/{name}", body=raw)
    assert exc.value.status == 422 and "immutable" in str(exc.value)
    raw = await request(api_client, "GET", f"{PATH}/{name}")
    raw["status"]["phase"] = "Bogus"  # the schema holds on the status subresource too
    with pytest.raises(KubeError) as exc:
        await request(api_client, "PUT", f"{PATH}/{name}/status", body=raw)
    assert exc.value.status == 422

    resp = await api_client.call_api(
        PATH,
        "GET",
        query_params=[("fieldSelector", f"spec.nodeName={node}")],
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    body = json.loads(await resp.read())
    resp.release()
    columns = [c["name"] for c in body["columnDefinitions"]]
    assert columns[:5] == ["Name", "Node", "Phase", "Action", "Reason"] and "Age" in columns
    (row,) = body["rows"]
    assert row["cells"][:5] == [name, node, "Quarantined", "reset-gpu", "Admitted"]

    # the watch-fed cache follows changes made elsewhere
    watched = GPURemediationStore(api_client)
    async with _watching(watched):
        await until(lambda: watched.get(name) is not None, "the episode in the watch cache")
        await request(
            api_client,
            "PATCH",
            f"{PATH}/{name}",
            body={"metadata": {"annotations": {KEYS.approve_annotation: "ann"}}},
            content_type="application/merge-patch+json",
        )
        await until(
            lambda: (watched.get(name) or ep).annotations.get(KEYS.approve_annotation) == "ann",
            "the annotation",
        )
        await store.delete(name)  # the cluster is shared: an active episode counts against the cap
        await until(lambda: watched.get(name) is None, "the deletion in the watch cache")
    assert name in seen


async def test_a_faults_scope_survives_the_api_server(
    api_client: client.ApiClient, crd: None, unique_name: Callable[[str], str]
) -> None:
    """``spec.fault.gpus[].scope`` is in the CRD's schema (not pruned): a shared-domain
    fault's episode reads back as written, so the controller's re-derivation matches it."""
    node = unique_name("scope-node")
    fabric = msgspec.structs.replace(xid48(), scope="nvlink-domain")
    facts = NodeFacts(
        name=node,
        boot_id="b1",
        gpus=(GpuFacts(uuid="GPU-1", index=0, state="unhealthy", conditions=(fabric,)),),
    )
    spec = expected_spec(
        node, "b1", failed_gpus(facts), detected_at=T0, history=(), settings=quick()
    )
    assert spec is not None and spec.action == "escalate"
    assert spec.fault.escalation_reason == SHARED_DOMAIN
    store = GPURemediationStore(api_client)
    name = episode_name(node, spec.fault.fingerprint)
    ep = await store.create(name, spec, {KEYS.node_label: node})
    assert ep is not None
    back = await store.fetch(name)
    assert back is not None and back.spec == spec
    assert back.spec.fault.gpus[0].scope == "nvlink-domain"
    await store.delete(name)


@contextlib.asynccontextmanager
async def _watching(store: GPURemediationStore) -> AsyncIterator[None]:
    import asyncio

    task = asyncio.create_task(store.run())
    try:
        await until(store.synced.is_set, "store synced")
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -------------------------------------------------------------------------------- evictions


async def test_pdb_refusal_is_retried_and_the_pod_never_deleted(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
    disruption_controller: bool,
) -> None:
    node = unique_name("pdb-node")
    await create_gpu_node(api_client, node)
    await make_pod(api_client, namespace, "trainer", node, labels={"app": "trainer"})
    await ready(api_client, namespace, "trainer")
    await create_pdb(api_client, namespace, "keep-one", 1, {"app": "trainer"})
    await settle_pdb(api_client, namespace, "keep-one", 0, disruption_controller)

    h = Harness(api_client, quick())
    h.agent_connects(node, faults={3: xid48()}, allocations=[alloc(namespace, "trainer", node, 3)])
    async with running(h):
        blocked = h.metrics.evictions.labels("blocked")
        await h.drive([node], lambda: blocked._value.get() >= 3, "three refused eviction rounds")
        ep = h.episode_of(node)
        assert ep.phase is Phase.DRAINING
        assert [(p.name, p.reason) for p in ep.status.waiting_pods] == [("trainer", "pdb-blocked")]
        assert "disruption budget" in ep.status.waiting_pods[0].message.lower()
        pod = await pod_or_none(api_client, namespace, "trainer")
        assert pod is not None and not pod["metadata"].get("deletionTimestamp")  # never deleted

        # a second replica makes room: the budget allows one disruption, the drain goes on
        await make_pod(api_client, namespace, "trainer-2", node, labels={"app": "trainer"}, gpus=0)
        await ready(api_client, namespace, "trainer-2")
        await settle_pdb(api_client, namespace, "keep-one", 1, disruption_controller)
        await h.drive(
            [node],
            lambda: (
                h.episode_of(node).phase is Phase.RETURNED
                and h.episode_of(node).status.times.returned is not None
            ),
            "the episode returned the node",
        )
    assert await pod_or_none(api_client, namespace, "trainer") is None
    assert (
        await pod_or_none(api_client, namespace, "trainer-2") is not None
    )  # not on the failed GPU
    node_obj = await request(api_client, "GET", f"/api/v1/nodes/{node}")
    assert not any(t["key"] == KEYS.quarantine_taint for t in node_obj["spec"].get("taints") or [])


async def test_gang_is_evicted_whole_and_the_partial_drain_spares_the_rest(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
) -> None:
    nodes = [unique_name(f"gang-{i}") for i in range(3)]
    for n in nodes:
        await create_gpu_node(api_client, n)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "suspend": True,  # its pods are made here, as the job controller would
            "completions": 3,
            "parallelism": 3,
            "completionMode": "Indexed",
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
            },
        },
    }
    made = await request(
        api_client, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", body=job
    )
    uid = made["metadata"]["uid"]
    labels = {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/controller-uid": uid}
    # The job controller's labels (the gang rule reads them); no ownerReference, because
    # kwok's pod-complete stage finishes Job-owned pods at once and these must keep running.
    for i, n in enumerate(nodes):
        await make_pod(api_client, namespace, f"train-{i}", n, labels=labels)
    await make_pod(api_client, namespace, "solo", nodes[0])  # GPU 5: healthy
    await make_pod(
        api_client,
        namespace,
        "other-job-0",
        nodes[1],
        labels={"batch.kubernetes.io/job-name": "other"},
    )
    ds_owner = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "agent",
            "uid": "ds-uid",
            "controller": True,
        }
    ]
    await make_pod(api_client, namespace, "node-agent", nodes[0], owners=ds_owner, gpus=0)
    await ready(
        api_client, namespace, "train-0", "train-1", "train-2", "solo", "other-job-0", "node-agent"
    )

    with_jobs = GangSettings(kinds=(*GangSettings().kinds, "job"))  # plain Jobs: opt-in
    h = Harness(api_client, quick(drain=DrainSettings(retry_s=0.5, gang=with_jobs)))
    h.agent_connects(
        nodes[0],
        faults={2: xid48()},
        allocations=[
            alloc(namespace, "train-0", nodes[0], 2),
            alloc(namespace, "solo", nodes[0], 5),
        ],
    )
    async with running(h):
        await h.drive(
            [nodes[0]],
            lambda: h.episode_of(nodes[0]).status.times.returned is not None,
            "the episode returned the node",
        )
    ep = h.episode_of(nodes[0])
    assert sorted((p.name, p.node) for p in ep.status.evicted_pods) == sorted(
        (f"train-{i}", n) for i, n in enumerate(nodes)
    )
    assert {p.gang for p in ep.status.evicted_pods} == {
        f"job:batch.kubernetes.io/controller-uid={uid}"
    }
    for name in ("train-0", "train-1", "train-2"):
        await until(lambda name=name: _gone(api_client, namespace, name), f"{name} gone")
    for name in ("solo", "other-job-0", "node-agent"):
        pod = await pod_or_none(api_client, namespace, name)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp"), name
    assert sum(h.agent.executed.values()) == 2  # one reset, one validation


async def _gone(api: client.ApiClient, ns: str, name: str) -> bool:
    return await pod_or_none(api, ns, name) is None


async def test_escalation_labels_the_node_and_posts_events(
    api_client: client.ApiClient, crd: None, kwok: Kwok, unique_name: Callable[[str], str]
) -> None:
    node = unique_name("rma-node")
    await create_gpu_node(api_client, node)
    h = Harness(api_client, quick())
    h.agent_connects(node, faults={1: contact_support()}, allocations=[])
    async with running(h):
        await h.drive([node], lambda: h.episode_of(node).phase is Phase.ESCALATED, "escalated")
        await h.round([node])
    ep = h.episode_of(node)
    obj = await request(api_client, "GET", f"/api/v1/nodes/{node}")
    assert obj["metadata"]["labels"][KEYS.rma_label] == "contact-support"
    assert any(
        t["key"] == KEYS.quarantine_taint and t["value"] == "escalated"
        for t in obj["spec"]["taints"]
    )

    found = await until(lambda: events_about(api_client, ep.name), "Events about the episode")
    reasons = {e["reason"] for e in found}
    assert {"RemediationStarted", "RemediationEscalated"} <= reasons
    assert all(e["involvedObject"]["uid"] == ep.uid for e in found)


async def test_validation_pod_runs_on_the_node_tolerating_the_quarantine(
    api_client: client.ApiClient, crd: None, namespace: str, unique_name: Callable[[str], str]
) -> None:
    from gpuhealth.controller.remediation.pods import RemediationPods
    from gpuhealth.controller.remediation.settings import ValidationPodSettings

    node = unique_name("val-node")
    facts = NodeFacts(
        name=node,
        boot_id="b1",
        gpus=(GpuFacts(uuid="GPU-1", index=0, state="unhealthy", conditions=(xid48(),)),),
    )
    spec = expected_spec(
        node, "b1", failed_gpus(facts), detected_at=T0, history=(), settings=quick()
    )
    assert spec is not None
    store = GPURemediationStore(api_client)
    ep = await store.create(episode_name(node, spec.fault.fingerprint), spec, {})
    assert ep is not None
    cfg = ValidationPodSettings(
        namespace=namespace,
        spec={"containers": [{"name": "smoke", "image": "cuda-smoke"}]},
        timeout_s=300,
    )
    pods = RemediationPods(api_client, KEYS, validation=cfg)
    uid = await pods.create_validation_pod("smoke-1", node, ep)
    assert uid is not None
    assert await pods.create_validation_pod("smoke-1", node, ep) is None  # the name is taken
    pod = await request(api_client, "GET", f"/api/v1/namespaces/{namespace}/pods/smoke-1")
    assert pod["metadata"]["uid"] == uid
    assert pod["spec"]["nodeName"] == node and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["activeDeadlineSeconds"] == 300  # validation.pod.timeout_s
    assert {"key": KEYS.quarantine_taint, "operator": "Exists"} in pod["spec"]["tolerations"]
    (owner,) = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("GPURemediation", ep.name, ep.uid)
    facts_seen = await pods.validation_pod(namespace, "smoke-1")
    assert facts_seen is not None and facts_seen.phase == "Pending" and facts_seen.uid == uid

    # someone who may create pods there made the next name's pod first, a perfect copy
    # (owner, labels, node): the create answers 409, no UID is recorded, and the
    # validation never takes that pod for its own: it goes on under a new name
    copy = {k: v for k, v in pod["metadata"].items() if k in ("labels", "ownerReferences")}
    copy["name"] = "smoke-2"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": copy, "spec": pod["spec"]}
    await request(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    assert await pods.create_validation_pod("smoke-2", node, ep) is None
    lookalike = await pods.validation_pod(namespace, "smoke-2")
    assert lookalike is not None and lookalike.uid not in ("", uid)
    from gpuhealth.controller.remediation.model import ValidationStatus
    from gpuhealth.controller.remediation.validating import validation_pod_step

    v = ValidationStatus(attempt=2, started_at=T0, pod_name="smoke-2")
    after, acts, problem = validation_pod_step(ep, v, lookalike)
    assert problem is None and not after.pod_passed and after.pod_name != "smoke-2"
    assert len(acts) == 1
    await store.delete(ep.name)


# ------------------------------------------------------------------------------ blast radius

HOLD = "test.gpuhealth.io/hold"
JOBSET = {"jobset.sigs.k8s.io/jobset-name": "train"}


async def held_gang(
    api: client.ApiClient, ns: str, unique_name: Callable[[str], str], prefix: str
) -> list[str]:
    """Three GPU nodes and a JobSet-like gang over them (train-0 on the first, held
    Terminating by a finalizer once evicted), every member running; the nodes."""
    nodes = [unique_name(f"{prefix}-{i}") for i in range(3)]
    for n in nodes:
        await create_gpu_node(api, n)
    await make_pod(api, ns, "train-0", nodes[0], labels=JOBSET, finalizers=[HOLD])
    for i in (1, 2):
        await make_pod(api, ns, f"train-{i}", nodes[i], labels=JOBSET)
    await ready(api, ns, "train-0", "train-1", "train-2")
    return nodes


async def terminating(api: client.ApiClient, ns: str, name: str) -> bool:
    pod = await pod_or_none(api, ns, name)
    return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))


async def release(api: client.ApiClient, ns: str, name: str) -> None:
    await request(
        api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}",
        body={"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )


async def events_about(api: client.ApiClient, ep_name: str) -> list[dict[str, Any]]:
    data = await request(
        api,
        "GET",
        "/api/v1/namespaces/default/events",
        query=[
            ("fieldSelector", f"involvedObject.name={ep_name},involvedObject.kind=GPURemediation")
        ],
    )
    return list(data.get("items") or [])


async def test_jobset_gang_is_charged_per_node_frozen_and_replacements_are_never_evicted(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
    disruption_controller: bool,
) -> None:
    """A JobSet-like gang on three nodes behind a PodDisruptionBudget: held whole while the
    budget refuses part of it, then evicted whole, each node charged to the gate first. The
    faulty node's member is held Terminating by a finalizer while the job controller starts
    replacements (same labels, new UIDs) on the healthy nodes; a restarted controller (a new
    runner and caches) keeps the frozen membership from the status and evicts none of them."""
    nodes = await held_gang(api_client, namespace, unique_name, "js")
    pdbs = await create_pdb(api_client, namespace, "train", 2, JOBSET)
    await settle_pdb(api_client, namespace, "train", 1, disruption_controller)
    faults = {2: xid48()}
    allocations = [alloc(namespace, "train-0", nodes[0], 2)]
    try:
        h = Harness(api_client, quick())
        h.agent_connects(nodes[0], faults=faults, allocations=allocations)
        async with running(h):
            await h.drive(
                [nodes[0]],
                lambda: (
                    {p.reason for p in h.episode_of(nodes[0]).status.waiting_pods}
                    == {"gang-pdb-blocked"}
                ),
                "the gang held whole by its budget",
            )
            for i in range(3):  # the budget allows one: no member is evicted, anywhere
                assert not await terminating(api_client, namespace, f"train-{i}")
            assert not [w for w in h.gate.requests if w.kind == "evict"]

            await request(
                api_client,
                "PATCH",
                f"{pdbs}/train",
                body={"spec": {"minAvailable": 0}},
                content_type="application/merge-patch+json",
            )
            await settle_pdb(api_client, namespace, "train", 3, disruption_controller)
            await h.drive(
                [nodes[0]],
                lambda: h.episode_of(nodes[0]).status.evicted_count == 3,
                "the whole gang evicted",
            )
        assert {w.node for w in h.gate.requests if w.kind == "evict"} == set(nodes)
        ep = h.episode_of(nodes[0])
        (frozen,) = ep.status.frozen_gangs
        assert frozen.kind == "jobset" and len(frozen.uids) == 3
        assert ep.status.touched_nodes == sorted(nodes[1:])
        for i in (1, 2):
            await until(lambda i=i: _gone(api_client, namespace, f"train-{i}"), f"train-{i} gone")
        assert await terminating(api_client, namespace, "train-0")  # held by its finalizer

        # the job controller replaces the gang on the healthy nodes while train-0 terminates
        for i, n in ((0, nodes[1]), (1, nodes[1]), (2, nodes[2])):
            await make_pod(api_client, namespace, f"train-{i}-r", n, labels=JOBSET)
        await ready(api_client, namespace, "train-0-r", "train-1-r", "train-2-r")

        # a restarted controller: new runner, new caches; the membership comes from status
        h2 = Harness(api_client, quick())
        h2.agent_connects(nodes[0], faults=faults, allocations=allocations)
        async with running(h2):
            for _ in range(12):  # several drain.retry_s rounds
                await h2.round([nodes[0]])
                await asyncio.sleep(0.25)
            ep = h2.episode_of(nodes[0])
            assert ep.phase is Phase.DRAINING
            assert [(p.name, p.reason) for p in ep.status.waiting_pods] == [
                ("train-0", "terminating")
            ]
            await release(api_client, namespace, "train-0")
            await h2.drive(
                [nodes[0]],
                lambda: h2.episode_of(nodes[0]).status.times.returned is not None,
                "the episode returned the node",
            )
        for name in ("train-0-r", "train-1-r", "train-2-r"):  # replacements: never evicted
            assert not await terminating(api_client, namespace, name), name
        assert h2.episode_of(nodes[0]).status.evicted_count == 3
    finally:
        with contextlib.suppress(KubeError):
            await release(api_client, namespace, "train-0")


async def test_a_gang_over_the_default_caps_is_held_whole(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
) -> None:
    """The chart's defaults: one fault whose JobSet spans 10 healthy nodes evicts no pod,
    charges no other node, holds the episode (BlastRadiusCap), posts one Event, counts it."""
    faulty = unique_name("cap-bad")
    healthy = [unique_name(f"cap-{i}") for i in range(10)]
    for n in (faulty, *healthy):
        await create_gpu_node(api_client, n)
    await make_pod(api_client, namespace, "train-x", faulty, labels=JOBSET)
    for i, n in enumerate(healthy):
        await make_pod(api_client, namespace, f"train-{i}", n, labels=JOBSET)
    await ready(api_client, namespace, "train-x", *(f"train-{i}" for i in range(10)))
    h = Harness(api_client, quick())
    h.agent_connects(
        faulty, faults={2: xid48()}, allocations=[alloc(namespace, "train-x", faulty, 2)]
    )
    async with running(h):
        await h.drive(
            [faulty],
            lambda: h.episode_of(faulty).status.reason == "BlastRadiusCap",
            "the episode held by the blast-radius cap",
        )
        for _ in range(6):
            await h.round([faulty])
            await asyncio.sleep(0.25)
    ep = h.episode_of(faulty)
    assert ep.phase is Phase.DRAINING and "drain.max_other_nodes (4)" in ep.status.message
    assert {c.type: c.reason for c in ep.status.conditions}["Held"] == "BlastRadiusCap"
    assert ep.status.evicted_count == 0 and ep.status.frozen_gangs == []
    assert {w.node for w in h.gate.requests} == {faulty}  # the quarantine only
    for name in ("train-x", *(f"train-{i}" for i in range(10))):
        assert not await terminating(api_client, namespace, name), name
    holds = h.registry.get_sample_value(
        "gpuhealth_remediation_holds_total", {"reason": "BlastRadiusCap"}
    )
    assert holds == 1
    found = await until(
        lambda: _reasons(api_client, ep.name, "BlastRadiusCap"), "the BlastRadiusCap Event"
    )
    assert len(found) == 1 and found[0]["count"] == 1


async def _reasons(api: client.ApiClient, ep_name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await events_about(api, ep_name) if e["reason"] == reason]


async def test_gpuhealths_own_pods_are_known_by_owner_and_a_tenant_label_protects_nothing(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
) -> None:
    """Two pods on the failed GPU carry ``app.kubernetes.io/name=gpuhealth``: a tenant's bare
    pod is drained; the one a ReplicaSet controls in gpuhealth's namespace is not."""
    own = unique_name("gpuhealth")
    await create_namespace(api_client, own)
    node = unique_name("own-node")
    await create_gpu_node(api_client, node)
    label = {"app.kubernetes.io/name": "gpuhealth"}
    rs = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "gpuhealth-controller-5d8f",
            "uid": "0b5c3a4e-0000-4000-8000-000000000001",
            "controller": True,
        }
    ]
    try:
        await make_pod(api_client, namespace, "impostor", node, labels=label)
        await make_pod(api_client, own, "controller", node, labels=label, owners=rs)
        await ready(api_client, namespace, "impostor")
        await ready(api_client, own, "controller")
        h = Harness(api_client, quick(), own_namespace=own)
        allocations = [alloc(namespace, "impostor", node, 2), alloc(own, "controller", node, 2)]
        h.agent_connects(node, faults={2: xid48()}, allocations=allocations)
        async with running(h):
            await h.drive(
                [node],
                lambda: h.episode_of(node).status.times.returned is not None,
                "the episode returned the node",
            )
        assert [p.name for p in h.episode_of(node).status.evicted_pods] == ["impostor"]
        mine = await pod_or_none(api_client, own, "controller")
        assert mine is not None and not mine["metadata"].get("deletionTimestamp")
    finally:
        with contextlib.suppress(KubeError):
            await request(api_client, "DELETE", f"/api/v1/namespaces/{own}")


async def test_a_hand_made_episode_with_a_forged_detection_time_touches_nothing(
    api_client: client.ApiClient, crd: None, kwok: Kwok, unique_name: Callable[[str], str]
) -> None:
    """Someone who may create GPURemediations writes the spec the controller would, except a
    detectedAt a month old (to dodge the repeat limit and jump the queue): the API server's
    creation time gives it away; the episode fails SpecMismatch, nothing is quarantined."""
    from datetime import UTC, datetime, timedelta

    node = unique_name("forged")
    await create_gpu_node(api_client, node)
    h = Harness(api_client, quick())
    h.agent_connects(node, faults={2: xid48()}, allocations=[])
    async with running(h):
        facts = await until(lambda: h.runner.p.nodes.node(node), "the node's facts")
        old = datetime.now(UTC) - timedelta(days=30)
        spec = expected_spec(
            node, facts.boot_id, failed_gpus(facts), detected_at=old, history=(), settings=quick()
        )
        assert spec is not None
        forged = await h.store.create(episode_name(node, spec.fault.fingerprint), spec, {})
        assert forged is not None
        await h.drive([node], lambda: h.episode_of(node).terminal, "the forged episode ended")
    ep = h.episode_of(node)
    assert ep.phase is Phase.FAILED and ep.status.reason == "SpecMismatch", ep.status.message
    assert "detectedAt" in ep.status.message and ep.status.times.quarantined is None
    obj = await request(api_client, "GET", f"/api/v1/nodes/{node}")
    assert not any(t["key"] == KEYS.quarantine_taint for t in obj["spec"].get("taints") or [])
    assert not h.gate.requests


async def test_a_gang_wider_than_the_breakers_room_is_held_without_tripping_it(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
) -> None:
    """The controller's WriteGate over a real CircuitBreaker with room for two nodes: the
    quarantine takes one, the gang's three other nodes would need three more. The drain reads
    the breaker's room for every node of the round before its first eviction and holds the
    episode (BlastRadiusCap); the breaker stays closed with only the quarantine counted, and
    no member is evicted on any node. Asked node by node, the gate counted two and opened on
    the third: nothing evicted and the whole fleet's hard writes stopped for one gang."""
    from gpuhealth.common.clock import SystemClock
    from gpuhealth.controller.breaker.gate import CircuitBreaker, WriteGate
    from gpuhealth.controller.breaker.settings import BreakerSettings
    from gpuhealth.controller.remediation.assembly import GateRoom

    nodes = [unique_name(f"brk-{i}") for i in range(4)]
    for n in nodes:
        await create_gpu_node(api_client, n)
    for i, n in enumerate(nodes):
        await make_pod(api_client, namespace, f"train-{i}", n, labels=JOBSET)
    await ready(api_client, namespace, *(f"train-{i}" for i in range(4)))
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=2), SystemClock())
    h = Harness(api_client, quick())
    gate = WriteGate(breaker, gpu_nodes=lambda: 100)
    h.runner.p.gate = gate
    h.runner.p.room = GateRoom(gate)
    h.agent_connects(
        nodes[0], faults={2: xid48()}, allocations=[alloc(namespace, "train-0", nodes[0], 2)]
    )
    async with running(h):
        await h.drive(
            [nodes[0]],
            lambda: h.episode_of(nodes[0]).status.reason == "BlastRadiusCap",
            "the drain held by the breaker's room",
        )
        for _ in range(4):
            await h.round([nodes[0]])
            await asyncio.sleep(0.25)
    status = breaker.status()
    assert not status.open and status.trips == 0 and status.recent_nodes == 1
    for i in range(4):
        assert not await terminating(api_client, namespace, f"train-{i}")
    ep = h.episode_of(nodes[0])
    assert ep.phase is Phase.DRAINING and ep.status.evicted_count == 0
    assert "has room for 1 more" in ep.status.message
    assert {p.reason for p in ep.status.waiting_pods} == {"over-cap"}


class LosesTheWriteAfterEvictions:
    """The episode store, except that the first status write after a pod was evicted is
    lost (the API server went away between the evictions and the write)."""

    def __init__(self, store: GPURemediationStore, api: client.ApiClient, ns: str) -> None:
        self._store = store
        self._api = api
        self._ns = ns
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def write_status(self, ep: Any, status: Any) -> Any:
        if not self.lost and await terminating(self._api, self._ns, "train-0"):
            self.lost += 1
            raise KubeError("injected: the status write after the evictions was lost", 503)
        return await self._store.write_status(ep, status)


async def test_the_status_is_written_ahead_of_each_eviction_round(
    api_client: client.ApiClient,
    crd: None,
    kwok: Kwok,
    namespace: str,
    unique_name: Callable[[str], str],
) -> None:
    """A gang of three evicted in one round, and the status write after the round lost: the
    GPURemediation in the API server already counts the three pods, keeps the frozen gang
    and the two other nodes it touched (written before the first eviction), so no later
    round's caps count low; the episode then finishes with the count unchanged."""
    nodes = await held_gang(api_client, namespace, unique_name, "wa")
    h = Harness(api_client, quick())
    lossy = LosesTheWriteAfterEvictions(h.store, api_client, namespace)
    h.runner.p.store = lossy  # type: ignore[assignment]
    h.agent_connects(
        nodes[0], faults={2: xid48()}, allocations=[alloc(namespace, "train-0", nodes[0], 2)]
    )
    try:
        async with running(h):

            async def evicted_then_lost() -> bool:
                with contextlib.suppress(KubeError):
                    await h.round([nodes[0]])
                return lossy.lost == 1

            await until(evicted_then_lost, "the write after the evictions lost", timeout_s=60)
            stored = await request(api_client, "GET", f"{PATH}/{h.episode_of(nodes[0]).name}")
            status = stored["status"]
            assert status["phase"] == "Draining" and status["evictedCount"] == 3
            assert status["touchedNodes"] == sorted(nodes[1:])
            (gang,) = status["frozenGangs"]
            assert gang["kind"] == "jobset" and len(gang["uids"]) == 3
            assert {p["reason"] for p in status["evictedPods"]} == {"evicting"}
            await release(api_client, namespace, "train-0")
            await h.drive(
                [nodes[0]],
                lambda: h.episode_of(nodes[0]).status.times.returned is not None,
                "the episode returned the node",
            )
        assert h.episode_of(nodes[0]).status.evicted_count == 3
    finally:
        with contextlib.suppress(KubeError):
            await release(api_client, namespace, "train-0")
