"""Repair that works with the rest of the cluster (issue 41), against the real API server with
the real objects: Karpenter's NodeClaim and NodePool CRDs (``localkube/crds/karpenter``; no
Karpenter controller runs: the tests assert what gpuhealth writes and deletes), cluster-
autoscaler's and Karpenter's annotations, a managed repairer's condition on a Node, and the
in-process controller running as the chart's ServiceAccount with the chart's RBAC.

- An escalated node of a pool that allows it: guarded while held (``karpenter.sh/do-not-
  disrupt``, ``cluster-autoscaler.kubernetes.io/scale-down-disabled``), its NodeClaim deleted,
  the record (fault, RMA reason, replacement) kept on the GPURemediation after the Node goes.
- Bad input: a pool that does not allow it, a node in no pool, a NodeClaim that does not
  exist: an Event and a metric each, nothing deleted.
- A node-group node (``method: node``): cordoned, drained through the Eviction API, deleted.
- The guards and the cordon are lifted only where gpuhealth set them; the node's own identity
  may remove an annotation itself (so trusting the record on the Node gives it nothing) and may
  not touch its ownerReferences (so the NodeClaim link is not the kubelet's to forge).
- A managed repairer's condition holds the episode (no quarantine, no guard); gpuhealth still
  taints.
- Per-pool breaker budgets: a storming small pool opens its own breaker, the other pool goes
  on, the ConfigMap keeps it, a reset takes it up again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ConflictError,
    KubeError,
    NotFoundError,
    PermanentKubeError,
    request,
)
from gpuhealth.controller.remediation.episode_store import PATH as EPISODES
from localkube import ControlPlane
from localkube.crds import karpenter_crds
from localkube.kwok import Kwok
from tests.integration.controller_helpers import (
    EXCLUDE,
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    our_taints,
)
from tests.integration.remediation_helpers import contact_support, install_crd, xid48
from tests.support.protocol import XID79, hello, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
DND = "karpenter.sh/do-not-disrupt"
CAS = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
GUARDS = f"{PREFIX}/guards"
QUARANTINE = f"{PREFIX}/remediation"
RMA = f"{PREFIX}/rma"
LOOP = {
    "remediation": {
        "quarantine_check_s": 0.2,
        "resync_s": 1.0,
        "safety": {"max_concurrent": 10, "max_fraction": 1.0},
    },
    "breaker": {"max_fraction": 1.0},
}
"""Fast passes, caps that never hold these tests' few episodes back."""


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        await install_crd(c.api)
        for crd in karpenter_crds():
            await _install(c.api, crd)
        yield c


async def _install(api: Any, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    with contextlib.suppress(ConflictError):
        await request(api, "POST", CRDS, body=crd, timeout_s=30)

    async def established() -> bool:
        crd = await request(api, "GET", f"{CRDS}/{name}", timeout_s=10)
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

    await until(established, f"{name} established", timeout_s=30)


NODE_CLASS = {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}
REQUIREMENTS = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]


async def nodepool(api: Any, name: str) -> None:
    body = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"nodeClassRef": NODE_CLASS, "requirements": REQUIREMENTS}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized"},
        },
    }
    with contextlib.suppress(ConflictError):
        await request(api, "POST", NODEPOOLS, body=body)


async def nodeclaim(api: Any, name: str, pool: str, node: str) -> str:
    """A NodeClaim of ``pool`` registered as ``node`` (its status as Karpenter writes it);
    returns its UID."""
    body = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}},
        "spec": {"nodeClassRef": NODE_CLASS, "requirements": REQUIREMENTS},
    }
    created = await request(api, "POST", NODECLAIMS, body=body)
    status = {"status": {"nodeName": node, "providerID": f"kwok://{node}"}}
    await request(
        api, "PATCH", f"{NODECLAIMS}/{name}/status", body=status, content_type=MERGE_PATCH
    )
    return str(created["metadata"]["uid"])


async def karpenter_node(
    kube: Cluster, name: str, pool: str, claim: str, claim_uid: str, **kw: Any
) -> str:
    """A GPU Node as Karpenter registers it: its pool label, owned by its NodeClaim."""
    from localkube.objects import gpu_node_body

    body = gpu_node_body(name, gpus=2, kwok=False, labels={"karpenter.sh/nodepool": pool}, **kw)
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "name": claim,
            "uid": claim_uid,
            "blockOwnerDeletion": True,
        }
    ]
    await request(kube.api, "POST", "/api/v1/nodes", body=body)
    kube.nodes.append(name)
    return name


async def patch_node(api: Any, name: str, metadata: dict[str, Any]) -> None:
    """A merge patch of the Node's metadata (as ``api``: an operator, or the node itself)."""
    await request(
        api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        body={"metadata": metadata},
        content_type=MERGE_PATCH,
    )


async def exists(api: Any, path: str) -> bool:
    try:
        await request(api, "GET", path)
    except NotFoundError:
        return False
    return True


async def episode_of(api: Any, node: str) -> dict[str, Any] | None:
    data = await request(api, "GET", EPISODES, query=[("labelSelector", f"{PREFIX}/node={node}")])
    items = data.get("items") or []
    return items[0] if len(items) == 1 else None


async def replacement(api: Any, node: str) -> dict[str, Any]:
    ep = await episode_of(api, node)
    return ((ep or {}).get("status") or {}).get("replacement") or {}


async def events(api: Any, name: str, reason: str) -> list[dict[str, Any]]:
    data = await request(
        api,
        "GET",
        "/api/v1/namespaces/default/events",
        query=[("fieldSelector", f"involvedObject.name={name},reason={reason}")],
    )
    return list(data.get("items") or [])


def _events_of(
    kube: Cluster, name: str, reason: str
) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
    async def found() -> list[dict[str, Any]]:
        return await events(kube.api, name, reason)

    return found


def sample(ctl: Controller, name: str, labels: dict[str, str]) -> float:
    return ctl.parts.registry.get_sample_value(name, labels) or 0.0


def faulty(ctl: Controller, node: str, condition: Any = None) -> None:
    ctl.parts.fleet.on_connect(node, hello(node))
    ctl.parts.fleet.on_message(node, snapshot(node, faults={0: condition or contact_support()}))


async def test_an_escalated_karpenter_node_is_guarded_replaced_and_kept_on_record(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    pool, name, claim = unique_name("gpu-a"), unique_name("kgpu"), unique_name("nc")
    kube.chart_values = {
        "remediation": {"enabled": True, "escalate": True, "replacePools": [{"pool": pool}]}
    }
    await nodepool(kube.api, pool)
    claim_uid = await nodeclaim(kube.api, claim, pool, name)
    await karpenter_node(kube, name, pool, claim, claim_uid)
    ctl = await kube.controller(LOOP)
    faulty(ctl, name)

    async def guarded_and_escalated() -> dict[str, Any] | None:
        node = await get_node(kube.api, name)
        ann = node["metadata"].get("annotations") or {}
        held = ann.get(DND) == "true" and ann.get(CAS) == "true"
        return node if held and (node["metadata"].get("labels") or {}).get(RMA) else None

    node = await until(guarded_and_escalated, "the node guarded and escalated", timeout_s=60)
    assert set(node["metadata"]["annotations"][GUARDS].split(",")) == {DND, CAS}
    assert QUARANTINE in {key for key, _, _ in our_taints(node)}

    async def claim_gone() -> bool | None:
        return None if await exists(kube.api, f"{NODECLAIMS}/{claim}") else True

    await until(claim_gone, "the NodeClaim deleted", timeout_s=60)
    rep = await replacement(kube.api, name)
    assert rep["state"] == "Deleted" and rep["method"] == "nodeclaim" and rep["pool"] == pool
    assert (rep["nodeClaim"], rep["nodeClaimUid"]) == (claim, claim_uid)
    assert rep["rma"] == "contact-support" and rep["nodeUid"] == node["metadata"]["uid"]
    ep = await episode_of(kube.api, name)
    assert ep is not None and not ep["metadata"].get("ownerReferences")  # outlives the Node
    await until(
        lambda: events(kube.api, ep["metadata"]["name"], "NodeReplacementRequested"),
        "the NodeReplacementRequested Event",
    )
    labels = {"method": "nodeclaim", "result": "requested"}
    assert sample(ctl, "gpuhealth_remediation_replacements_total", labels) == 1
    allowed = {"kind": "replace-node", "decision": "allowed"}
    assert sample(ctl, "gpuhealth_hard_writes_total", allowed) == 1
    (incident,) = ctl.parts.incidents.book.list(kind="replacement")
    assert incident.subjects.nodes == (name,) and claim in incident.decision

    async def incident_object(state: str) -> dict[str, Any] | None:
        """The leader's GPUIncident object of the replacement, once it is ``state``."""
        with contextlib.suppress(NotFoundError):
            obj = await request(kube.api, "GET", f"{INCIDENTS}/{incident.id}")
            st = obj.get("status") or {}
            return obj if st.get("kind") == "replacement" and st.get("state") == state else None
        return None

    obj = await until(lambda: incident_object("open"), "the replacement's GPUIncident")
    assert obj["status"]["subjects"]["nodes"] == [name]
    # Karpenter would drain and delete the Node now; the record stays
    await request(kube.api, "DELETE", f"/api/v1/nodes/{name}")

    async def completed() -> bool | None:
        return True if (await replacement(kube.api, name)).get("state") == "Completed" else None

    await until(completed, "the replacement completed", timeout_s=30)
    ep = await episode_of(kube.api, name)
    assert ep is not None and ep["status"]["phase"] == "Escalated"
    assert ep["spec"]["fault"]["gpus"][0]["code"] == "row-remap-failure"
    assert ctl.parts.incidents.book.find("replacement", ep["metadata"]["name"]) is None
    assert ctl.parts.incidents.book.list(kind="replacement", include_closed=True)
    await until(lambda: incident_object("closed"), "the replacement's GPUIncident closed")


async def test_not_replaced_says_why_and_deletes_nothing(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """A pool that does not allow replacement, a node in no pool (no pool label), and a Node
    naming a NodeClaim that does not exist: an Event and a metric each, nothing deleted."""
    allowed_pool, other_pool = unique_name("ok"), unique_name("no")
    kube.chart_values = {
        "remediation": {"enabled": True, "escalate": True, "replacePools": [{"pool": allowed_pool}]}
    }
    await nodepool(kube.api, other_pool)
    other, loose, orphan = unique_name("other"), unique_name("loose"), unique_name("orphan")
    other_claim = unique_name("nc")
    uid = await nodeclaim(kube.api, other_claim, other_pool, other)
    await karpenter_node(kube, other, other_pool, other_claim, uid)
    await kube.node(loose)
    await karpenter_node(kube, orphan, allowed_pool, unique_name("missing"), "0f0f-missing")
    ctl = await kube.controller(LOOP)
    for n in (other, loose, orphan):
        faulty(ctl, n)

    async def decided() -> dict[str, dict[str, Any]] | None:
        got = {n: await replacement(kube.api, n) for n in (other, loose, orphan)}
        return got if all(r.get("state") for r in got.values()) else None

    got = await until(decided, "a replacement decision for each node", timeout_s=90)
    assert (got[other]["state"], got[other]["reason"]) == ("Skipped", "PoolNotAllowed")
    assert (got[loose]["state"], got[loose]["reason"]) == ("Skipped", "NoPool")
    assert (got[orphan]["state"], got[orphan]["reason"]) == ("Failed", "NodeClaimNotFound")
    assert await exists(kube.api, f"{NODECLAIMS}/{other_claim}")
    for n in (other, loose, orphan):
        assert await exists(kube.api, f"/api/v1/nodes/{n}")
    for n, reason in (
        (other, "NodeReplacementSkipped"),
        (loose, "NodeReplacementSkipped"),
        (orphan, "NodeReplacementFailed"),
    ):
        ep = await episode_of(kube.api, n)
        assert ep is not None
        found = await until(_events_of(kube, ep["metadata"]["name"], reason), reason)
        assert found[0]["type"] == ("Warning" if reason.endswith("Failed") else "Normal")
    skipped = {"method": "none", "result": "skipped"}
    assert sample(ctl, "gpuhealth_remediation_replacements_total", skipped) == 2
    failed = {"method": "nodeclaim", "result": "failed"}
    assert sample(ctl, "gpuhealth_remediation_replacements_total", failed) == 1
    # only the orphan's delete was asked of the gate (it found nothing to delete)
    asked = {"kind": "replace-node", "decision": "allowed"}
    assert sample(ctl, "gpuhealth_hard_writes_total", asked) == 1


async def test_a_node_group_node_is_cordoned_drained_and_deleted(
    kube: Cluster, kwok: Kwok, unique_name: Callable[[str], str]
) -> None:
    group, ns = unique_name("ng"), unique_name("work")
    kube.chart_values = {
        "remediation": {
            "enabled": True,
            "escalate": True,
            "replacePools": [{"pool": group, "method": "node"}],
        }
    }
    name = await kube.node(
        unique_name("asg"), kwok=True, labels={"eks.amazonaws.com/nodegroup": group}
    )
    await kube.namespace(ns)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeName": name,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    await request(kube.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    ctl = await kube.controller(LOOP)
    faulty(ctl, name)

    async def node_gone() -> bool | None:
        return None if await exists(kube.api, f"/api/v1/nodes/{name}") else True

    await until(node_gone, "the Node deleted after its drain", timeout_s=90)
    assert not await exists(kube.api, f"/api/v1/namespaces/{ns}/pods/train")
    ep = await episode_of(kube.api, name)
    assert ep is not None
    assert any(p["name"] == "train" for p in ep["status"].get("evictedPods") or [])

    async def completed() -> bool | None:
        return True if (await replacement(kube.api, name)).get("state") == "Completed" else None

    await until(completed, "the replacement completed", timeout_s=30)
    node_method = {"method": "node", "result": "requested"}
    assert sample(ctl, "gpuhealth_remediation_replacements_total", node_method) == 1
    with contextlib.suppress(KubeError):
        await request(kube.api, "DELETE", f"/api/v1/namespaces/{ns}")


async def test_guards_and_the_cordon_are_lifted_only_where_gpuhealth_set_them(
    kube: Cluster,
    node_api_client: Callable[[str], Awaitable[Any]],
    unique_name: Callable[[str], str],
) -> None:
    kube.chart_values = {"remediation": {"enabled": True, "escalate": True}}
    name = await kube.node(unique_name("guard"))
    # someone else's scale-down protection, there before gpuhealth
    await patch_node(kube.api, name, {"annotations": {CAS: "true"}})
    ctl = await kube.controller({**LOOP, "policy": {"cordon": "quarantine"}})
    faulty(ctl, name)

    async def held() -> dict[str, Any] | None:
        node = await get_node(kube.api, name)
        ann = node["metadata"].get("annotations") or {}
        return node if ann.get(DND) == "true" and node["spec"].get("unschedulable") else None

    node = await until(held, "do-not-disrupt and the cordon while held", timeout_s=60)
    assert set(node["metadata"]["annotations"][GUARDS].split(",")) == {DND, "spec.unschedulable"}

    # The node's own identity: it may remove an annotation itself (the record on the Node
    # gives it no power it lacks) and may not touch its ownerReferences (NodeRestriction)
    own = await node_api_client(name)
    await patch_node(own, name, {"annotations": {DND: None}})
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "x", "uid": "u"}
    with pytest.raises(PermanentKubeError) as refused:
        await patch_node(own, name, {"ownerReferences": [owner]})
    assert refused.value.status == 403
    await kube.settle(ctl)
    ctl.parts.reconciler.enqueue(name)  # and a pass after that one: still not put back
    await kube.settle(ctl)
    node = await get_node(kube.api, name)
    ann = node["metadata"].get("annotations") or {}
    assert DND not in ann and ann[GUARDS] == f"spec.unschedulable,!{DND}"  # declined, not fought

    # an operator hands the node to a person: gpuhealth lets go of what it set, only that
    await patch_node(kube.api, name, {"labels": {EXCLUDE: "true"}})

    async def released() -> dict[str, Any] | None:
        n = await get_node(kube.api, name)
        return n if not n["spec"].get("unschedulable") and not our_taints(n) else None

    node = await until(released, "the cordon and the taints lifted", timeout_s=30)
    ann = node["metadata"].get("annotations") or {}
    assert ann.get(CAS) == "true" and GUARDS not in ann


async def test_a_managed_repairer_owns_the_node_gpuhealth_taints_and_records(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    kube.chart_values = {"remediation": {"enabled": True, "resetGpu": True}}
    name = await kube.node(unique_name("eks"))
    cond = {
        "type": "AcceleratedHardwareReady",
        "status": "False",
        "reason": "NvidiaXID48Error",
        "message": "the EKS node monitoring agent saw XID 48",
    }
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"conditions": [cond]}},
        content_type="application/strategic-merge-patch+json",
    )
    ctl = await kube.controller(LOOP)
    faulty(ctl, name, xid48())

    async def owned() -> dict[str, Any] | None:
        ep = await episode_of(kube.api, name)
        st = (ep or {}).get("status") or {}
        return ep if st.get("reason") == "ManagedRepair" else None

    ep = await until(owned, "the episode held for the managed repairer", timeout_s=60)
    assert ep["status"]["phase"] == "Pending"
    assert ep["status"]["managedRepair"]["owner"] == "eks-node-auto-repair"
    assert ep["status"]["managedRepair"]["signal"] == "AcceleratedHardwareReady=False"
    await until(
        lambda: events(kube.api, ep["metadata"]["name"], "ManagedRepairOwnsNode"),
        "the ManagedRepairOwnsNode Event",
    )
    node = await get_node(kube.api, name)
    assert (UNHEALTHY, "xid-48", "NoSchedule") in our_taints(node)  # gpuhealth still taints
    assert QUARANTINE not in {t[0] for t in our_taints(node)}
    assert DND not in (node["metadata"].get("annotations") or {})
    owner = {"owner": "eks-node-auto-repair"}
    assert sample(ctl, "gpuhealth_remediation_managed_repairs_total", owner) == 1
    # the managed service is done with it: gpuhealth goes on (quarantine, guards)
    cond["status"] = "True"
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"conditions": [cond]}},
        content_type="application/strategic-merge-patch+json",
    )

    async def quarantined() -> bool | None:
        n = await get_node(kube.api, name)
        keys = {t[0] for t in our_taints(n)}
        return (
            True
            if QUARANTINE in keys and (n["metadata"].get("annotations") or {}).get(DND)
            else None
        )

    await until(quarantined, "the quarantine and the guards once the repairer let go", timeout_s=60)


async def test_a_storming_pool_opens_its_own_breaker_and_the_other_pool_goes_on(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """Ten GPU nodes, a pool of two (small) and a pool of eight (big); max_fraction 0.5: the
    fleet's budget is 5, the small pool's 1, the big pool's 4. Both small nodes and two big
    ones fault: the small pool's second is held (its own breaker opens), the big ones are
    tainted, the fleet stays closed; the ConfigMap keeps the open pool; a reset takes it up."""
    small, big = unique_name("small"), unique_name("big")
    nodes = {
        n: pool
        for pool, count in ((small, 2), (big, 8))
        for n in [unique_name(f"{pool}-n{i}") for i in range(count)]
    }
    for n, pool in nodes.items():
        await kube.node(n, labels={"karpenter.sh/nodepool": pool})
    ctl = await kube.controller({"breaker": {"max_fraction": 0.5, "window_s": 600}})
    release = await kube.release()
    for n in nodes:
        ctl.parts.fleet.on_connect(n, hello(n))
        ctl.parts.fleet.on_message(n, snapshot(n))
    await kube.settle(ctl)
    storm = [n for n, p in nodes.items() if p == small] + [n for n, p in nodes.items() if p == big][
        :2
    ]
    for n in storm:
        ctl.parts.fleet.on_message(n, snapshot(n, faults={0: XID79}))
    await kube.settle(ctl)
    tainted = {n for n in storm if our_taints(await get_node(kube.api, n))}
    smalls = [n for n in storm if nodes[n] == small]
    assert len(tainted & set(smalls)) == 1 and set(storm) - set(smalls) <= tainted
    breaker = ctl.parts.breaker
    assert not breaker.is_open and set(breaker.open_pools) == {small}
    assert sample(ctl, "gpuhealth_circuit_breaker_pool_trips_total", {"pool": small}) == 1
    configmap = release.config["breaker"]["configmap"]
    cm = f"/api/v1/namespaces/{release.namespace}/configmaps/{configmap}"

    async def stored() -> dict[str, str] | None:
        with contextlib.suppress(NotFoundError):
            data = (await request(kube.api, "GET", cm)).get("data") or {}
            if data.get("state") == "open" and small in data.get("pools", ""):
                return dict(data)
        return None

    data = await until(stored, "the open pool in the breaker's ConfigMap", timeout_s=15)
    assert data["fleet"] == "closed"
    ctl.parts.gate.reset(by="test")
    await kube.settle(ctl)
    for n in smalls:
        assert our_taints(await get_node(kube.api, n)), n
