"""``gpuhealth-controller cleanup`` (the chart's pre-delete hook) against a real kube-apiserver.

A real controller writes its taint, labels, annotation, condition and DeviceTaintRule; a clean
stop leaves all of it (a restart is not an uninstall). The command, run as a process, refuses
while a controller still leads, waits for the controller's Deployment to be scaled down and
its pods to go, then removes exactly what gpuhealth wrote: foreign taints, labels,
annotations, conditions and DeviceTaintRules, and the operator's own gpuhealth labels, stay;
so do the GPUIncidents (the fleet's history, which a later install adopts).

With the remediation loop's validation pods configured, the command deletes the validation
pods the loop created (their owner, the GPURemediation, outlives the release with its kept
CRD, so the garbage collector never would), and not a pod that only copies their label.

Controller and command run as the chart would run them: the release's controller
ServiceAccount, and the uninstall hook's ServiceAccount with the hook's RBAC
(``tests.integration.chart_identity``), so the hook's permissions are proven sufficient.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.controller.breaker.shard_store import shard_configmap
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.incidents.model import Incident, Subjects
from gpuhealth.controller.incidents.resource import new_object, status_object, status_of
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.configmap import write_data
from gpuhealth.controller.kube.lease import LeaseClient, LeaseRecord
from gpuhealth.controller.kube.rest import KubeError, NotFoundError, request
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.episode_store import GPURemediationStore
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.pods import RemediationPods
from gpuhealth.controller.remediation.settings import ValidationPodSettings
from gpuhealth.controller.settings import load_config
from localkube import ControlPlane
from tests.integration.chart_identity import ChartRelease, service_account_token
from tests.integration.controller_helpers import (
    PREFIX,
    Cluster,
    cluster,
    get_node,
    gpu_condition,
    our_taints,
)
from tests.integration.remediation_helpers import CRD_NAME, install_crd, quick, xid48
from tests.support.fleet import connect
from tests.support.protocol import T0, fault, gpu_uuid
from tests.support.wait import until

pytestmark = pytest.mark.integration

RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
IDLE = f"{PREFIX}/idle-since"
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "yes", "effect": "NoSchedule"}
FOREIGN_CONDITION = {"type": "ExampleReady", "status": "True", "reason": "Fine", "message": "m"}
OPERATOR_LABEL = f"{PREFIX}/remediation"  # the operator's old opt-out: ignored, but kept
OPT_OUT = f"node-restriction.kubernetes.io/{PREFIX}-remediation"
"""The operator's opt-out (outside the prefix): an input, kept."""


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def _hook_identity(kube: Cluster) -> tuple[ChartRelease, Path]:
    """The test's release and a kubeconfig of its uninstall hook's ServiceAccount."""
    release = await kube.release()
    sa = release.controller_fullname.removesuffix("-controller") + "-cleanup"
    token = await service_account_token(kube.api, release.namespace, sa)
    kubeconfig = kube.cp.token_kubeconfig(token, f"{release.namespace}-{sa}")
    return release, kubeconfig


def _write_config(path: Path, release: ChartRelease, **sections: Any) -> Path:
    path.write_text(yaml.safe_dump({**release.config, "log_format": "json", **sections}))
    return path


def _cleanup(kubeconfig: Path, config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuhealth.controller.cli", "cleanup"),
            *("--kubeconfig", str(kubeconfig), "--config", str(config), *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )


async def _finish(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str, str]:
    out, err = await asyncio.to_thread(proc.communicate, timeout=timeout_s)
    return proc.returncode, out, err


async def _exists(kube: Cluster, path: str) -> bool:
    try:
        await request(kube.api, "GET", path)
    except NotFoundError:
        return False
    return True


async def _make_node(kube: Cluster, name: str) -> None:
    await kube.node(name)
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        body={
            "metadata": {
                "labels": {"team": "ml", OPERATOR_LABEL: "disabled", OPT_OUT: "disabled"},
                "annotations": {"example.com/owner": "infra"},
            },
            "spec": {"taints": [FOREIGN_TAINT]},
        },
        content_type=MERGE,
    )
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"conditions": [FOREIGN_CONDITION]}},
        content_type=STRATEGIC,
    )


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": gpu_uuid(i, node)}}}
                for i in range(2)
            ],
        },
    }


def _foreign_rule(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"team": "ml"}},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
            "taint": {"key": "example.com/broken", "value": "x", "effect": "NoSchedule"},
        },
    }


async def _our_rules(kube: Cluster, node: str) -> list[dict[str, Any]]:
    data = await request(
        kube.api, "GET", RULES, query=[("labelSelector", f"{PREFIX}/managed=true")]
    )
    return [
        r
        for r in data.get("items") or []
        if r["metadata"].get("annotations", {}).get(f"{PREFIX}/node") == node
    ]


def _ours(mapping: dict[str, str] | None) -> set[str]:
    return {k for k in mapping or {} if k.startswith(PREFIX + "/")}


async def test_cleanup_removes_what_the_controller_wrote_and_nothing_else(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    kube.chart_values = {"controller": {"idle": {"annotatePods": True}}}
    release, hook = await _hook_identity(kube)
    ns, fullname = release.namespace, release.controller_fullname
    name = unique_name("gpu-clean")
    await _make_node(kube, name)
    bystander = unique_name("gpu-other")  # never had anything of ours: not written at all
    await kube.node(bystander)
    await request(kube.api, "POST", SLICES, body=_slice(name))
    foreign_rule = unique_name("foreign-rule")
    await request(kube.api, "POST", RULES, body=_foreign_rule(foreign_rule, name))
    leader = {"enabled": True, "lease_duration_s": 4, "renew_deadline_s": 3.0}
    config = _write_config(
        tmp_path / "controller.yaml",
        release,
        cleanup={"stop_timeout_s": 2.0, "poll_interval_s": 0.1},
    )
    try:
        # A real controller writes everything it writes on a fault.
        ctl = await kube.controller({"leader": {**leader, "retry_period_s": 1.0}})
        connect(ctl.parts.fleet, name)
        ctl.parts.fleet.on_message(name, fault(name, 1))

        async def written() -> dict[str, Any] | None:
            node = await get_node(kube.api, name)
            done = our_taints(node) and gpu_condition(node) and await _our_rules(kube, name)
            return node if done else None

        node = await until(written, "the controller's taint, condition and DeviceTaintRule")
        await kube.settle(ctl)
        # the breaker's state: a ConfigMap the controller creates (no chart renders it)
        breaker = f"/api/v1/namespaces/{ns}/configmaps/{release.config['breaker']['configmap']}"
        await until(lambda: _exists(kube, breaker), "the breaker's ConfigMap, the controller's")
        # What cleanup removes from pods: the idle flag (written here as the tracker would).
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "trainer",
                "labels": {"app": "trainer"},
                "annotations": {IDLE: "2025-01-01T00:00:00Z", "example.com/keep": "1"},
            },
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        }
        await request(kube.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=pod)

        # While a controller leads, cleanup refuses (it would write everything back).
        code, _, err = await _finish(_cleanup(hook, config))
        assert code == 1, err
        assert "did not stop" in err and "nothing was removed" in err
        assert our_taints(await get_node(kube.api, name)) == our_taints(node)

        # A clean stop gives the Lease up and removes nothing.
        before = await get_node(kube.api, name)
        await kube.stop(ctl)
        after = await get_node(kube.api, name)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert our_taints(after) and gpu_condition(after)
        assert _ours(after["metadata"]["labels"]) == {
            f"{PREFIX}/state",
            f"{PREFIX}/healthy-gpus",
            OPERATOR_LABEL,
        }
        assert _ours(after["metadata"].get("annotations") or {}) == set()

        # The chart's hook: the controller's Deployment (here without pods of its own, no
        # kube-controller-manager) and a pod of it that outlives the scale-down for a while.
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": fullname},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "ctl"}},
                "template": {
                    "metadata": {"labels": {"app": "ctl"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        }
        deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
        await request(kube.api, "POST", deployments, body=deployment)
        ctl_pod = {**pod, "metadata": {"name": "ctl-0", "labels": {"app": "ctl"}}}
        await request(kube.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=ctl_pod)
        endpoint_slice = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": f"{fullname}-leader"},
            "addressType": "IPv4",
            "endpoints": [],
        }
        slices = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
        await request(kube.api, "POST", slices, body=endpoint_slice)

        history = await _incident(kube, release, name)  # the fleet's history: it stays

        _write_config(config, release, cleanup={"stop_timeout_s": 60, "poll_interval_s": 0.1})
        bystander_rv = (await get_node(kube.api, bystander))["metadata"]["resourceVersion"]
        proc = _cleanup(hook, config, "--stop-deployment", fullname, "--namespace", ns)

        async def scaled_down() -> bool:
            dep = await request(kube.api, "GET", f"{deployments}/{fullname}")
            return bool(dep["spec"]["replicas"] == 0)

        await until(scaled_down, "cleanup to scale the controller's Deployment to 0")
        # Its pod is still there: nothing may be removed yet.
        assert our_taints(await get_node(kube.api, name)) == our_taints(node)
        assert proc.poll() is None
        await request(
            kube.api,
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods/ctl-0",
            body={"gracePeriodSeconds": 0},
        )
        code, out, err = await _finish(proc)
        assert code == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["conditions"] >= 1 and summary["device_taint_rules"] >= 1
        assert summary["pods"] >= 1 and summary["endpoint_slices"] == 1
        assert summary["configmaps"] == 1 and not await _exists(kube, breaker)

        clean = await get_node(kube.api, name)
        assert clean["spec"]["taints"] == [FOREIGN_TAINT]
        assert _ours(clean["metadata"]["labels"]) == {OPERATOR_LABEL}
        assert clean["metadata"]["labels"]["team"] == "ml"
        assert clean["metadata"]["labels"][OPT_OUT] == "disabled"
        assert _ours(clean["metadata"]["annotations"]) == set()
        assert clean["metadata"]["annotations"]["example.com/owner"] == "infra"
        conditions = {c["type"]: c for c in clean["status"].get("conditions") or []}
        assert "GPUHealthy" not in conditions
        assert conditions["ExampleReady"]["reason"] == "Fine"
        other = await get_node(kube.api, bystander)
        assert other["metadata"]["resourceVersion"] == bystander_rv
        assert await _our_rules(kube, name) == []
        assert await _exists(kube, f"{RULES}/{foreign_rule}")
        trainer = await request(kube.api, "GET", f"/api/v1/namespaces/{ns}/pods/trainer")
        assert trainer["metadata"]["annotations"] == {"example.com/keep": "1"}
        assert not await _exists(kube, f"{slices}/{fullname}-leader")
        assert await _exists(kube, f"{INCIDENTS}/{history}")

        # Run again: nothing left to do, and it says so.
        code, out, err = await _finish(_cleanup(hook, config))
        assert code == 0, err
        again = json.loads(out.strip().splitlines()[-1])
        assert again["nodes"] == again["device_taint_rules"] == again["pods"] == 0
        assert (await get_node(kube.api, name))["metadata"]["resourceVersion"] == clean["metadata"][
            "resourceVersion"
        ]
    finally:
        for path in (f"{RULES}/{foreign_rule}", f"{SLICES}/{name}-gpu.nvidia.com"):
            with contextlib.suppress(KubeError):
                await request(kube.api, "DELETE", path)


async def _incident(kube: Cluster, release: ChartRelease, node: str) -> str:
    """A closed GPUIncident about ``node``, written with the controller's identity as a
    controller leaves them; its name."""
    api = await make_api_client(str(release.kubeconfig))
    kube.clients.append(api)
    incident = Incident(
        kind="unwatched",
        key=node,
        subjects=Subjects(nodes=(node,)),
        decision="condition AgentMissing",
        reason="GPU node with no gpuhealth agent",
        opened_at=T0,
        last_seen=T0,
        state="closed",
        closed_at=T0,
        close_reason="its agent reports again",
    )
    created = await request(api, "POST", INCIDENTS, body=new_object(incident, Keys()))
    body = status_object(incident.id, created["metadata"]["resourceVersion"], status_of(incident))
    await request(api, "PUT", f"{INCIDENTS}/{incident.id}/status", body=body)
    return incident.id


async def test_keep_taints_and_dry_run(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    release, hook = await _hook_identity(kube)
    name = unique_name("gpu-keep")
    await _make_node(kube, name)
    ctl = await kube.controller()
    connect(ctl.parts.fleet, name)
    ctl.parts.fleet.on_message(name, fault(name, 0))

    async def tainted() -> dict[str, Any] | None:
        node = await get_node(kube.api, name)
        return node if our_taints(node) and gpu_condition(node) else None

    node = await until(tainted, "the controller's taint")
    await kube.settle(ctl)
    await kube.stop(ctl)
    node = await get_node(kube.api, name)
    config = _write_config(tmp_path / "controller.yaml", release)

    code, out, err = await _finish(_cleanup(hook, config, "--dry-run"))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["taints"] >= 1
    untouched = await get_node(kube.api, name)
    assert untouched["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]

    code, _, err = await _finish(_cleanup(hook, config, "--keep-taints"))
    assert code == 0, err
    kept = await get_node(kube.api, name)
    assert our_taints(kept) == our_taints(node)
    assert FOREIGN_TAINT in kept["spec"]["taints"]
    assert _ours(kept["metadata"].get("annotations") or {}) == set()
    assert _ours(kept["metadata"]["labels"]) == {OPERATOR_LABEL}
    assert gpu_condition(kept) is None


async def test_cleanup_deletes_the_loops_validation_pods_and_no_lookalike(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    api = kube.api
    vns = unique_name("gpu-validation")
    await request(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": vns}})
    kube.chart_values = {"remediation": {"enabled": True, "validationPodNamespace": vns}}
    release, hook = await _hook_identity(kube)
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    crd_here = not await _exists(kube, crd_path)  # later tests create the chart's CRD
    await install_crd(api)
    # An episode, and its validation pod as the loop creates it (the real body).
    node = unique_name("gpu-val")
    facts = NodeFacts(
        name=node,
        boot_id="b1",
        gpus=(GpuFacts(uuid="GPU-1", index=0, state="unhealthy", conditions=(xid48(),)),),
    )
    spec = expected_spec(
        node, "b1", failed_gpus(facts), detected_at=T0, history=(), settings=quick()
    )
    assert spec is not None
    store = GPURemediationStore(api)
    ep = await store.create(episode_name(node, spec.fault.fingerprint), spec, {})
    assert ep is not None
    pod_spec = {"containers": [{"name": "smoke", "image": "registry.k8s.io/pause:3.10"}]}
    pods = RemediationPods(
        api, Keys(PREFIX), validation=ValidationPodSettings(namespace=vns, spec=pod_spec)
    )
    try:
        await pods.create_validation_pod("smoke-ours", node, ep)
        # Someone else's pods: the same episode label without the episode as owner, and the
        # loop's labels and owner in another namespace (not where the loop creates them).
        lookalike = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "smoke-lookalike",
                "labels": {
                    f"{PREFIX}/remediation-episode": spec.fault.fingerprint,
                    "app.kubernetes.io/managed-by": "gpuhealth-controller",
                },
            },
            "spec": pod_spec,
        }
        await request(api, "POST", f"/api/v1/namespaces/{vns}/pods", body=lookalike)
        elsewhere = pods.validation_pod_body("smoke-elsewhere", node, ep)
        elsewhere["metadata"]["namespace"] = release.namespace
        await request(api, "POST", f"/api/v1/namespaces/{release.namespace}/pods", body=elsewhere)
        remediation = {
            **release.config["remediation"],
            "validation": {"pod": {"namespace": vns, "spec": pod_spec}},
        }
        config = _write_config(tmp_path / "controller.yaml", release, remediation=remediation)

        code, out, err = await _finish(_cleanup(hook, config, "--dry-run"))
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1])["validation_pods"] == 1
        ours = await request(api, "GET", f"/api/v1/namespaces/{vns}/pods/smoke-ours")
        assert "deletionTimestamp" not in ours["metadata"]

        # Under the hook's own RBAC: ours goes (bound to a node without a kubelet, it waits
        # in Terminating for one), the others stay.
        code, out, err = await _finish(_cleanup(hook, config))
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1])["validation_pods"] == 1
        try:
            gone = await request(api, "GET", f"/api/v1/namespaces/{vns}/pods/smoke-ours")
            assert gone["metadata"].get("deletionTimestamp"), gone["metadata"]
        except NotFoundError:
            pass
        for path in (
            f"/api/v1/namespaces/{vns}/pods/smoke-lookalike",
            f"/api/v1/namespaces/{release.namespace}/pods/smoke-elsewhere",
        ):
            kept = await request(api, "GET", path)
            assert "deletionTimestamp" not in kept["metadata"], path

        # Again: nothing left to do.
        code, out, err = await _finish(_cleanup(hook, config))
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1])["validation_pods"] == 0
    finally:
        await store.delete(ep.name)
        with contextlib.suppress(KubeError):
            await request(api, "DELETE", f"/api/v1/namespaces/{vns}")
        if crd_here:
            await request(api, "DELETE", crd_path)
            await until(
                lambda: _gone(kube, crd_path), "the CRD this test created gone", timeout_s=60
            )


async def _gone(kube: Cluster, path: str) -> bool:
    return not await _exists(kube, path)


async def test_cleanup_past_one_process_removes_the_shards_objects(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A release with two shards: the command, with the uninstall hook's identity and RBAC,
    waits for every shard's Lease too (a held one stops it before anything is removed), then
    removes the shard label from every Node, each shard owner's EndpointSlice, each shard's
    breaker ConfigMap and the sizes ConfigMap."""
    kube.chart_values = {"shards": {"count": 2}, "controller": {"replicas": 2}}
    release, hook = await _hook_identity(kube)
    ns = release.namespace
    cfg = load_config(None, release.config)
    assert cfg.shards.count == 2
    shard_label = Keys().shard_label
    nodes = [unique_name("gpu-shard") for _ in range(2)]
    for i, name in enumerate(nodes):
        await kube.node(name, labels={shard_label: str(i), "team": "ml"})
    configmaps = [*(shard_configmap(cfg.breaker.configmap, i) for i in range(2))]
    configmaps.append(cfg.shards.sizes_configmap)
    for name in configmaps:
        await write_data(kube.api, ns, name, {"state": "closed"}, timeout_s=10)
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
    owners = [f"{cfg.leader.service}-shard-{i}-leader" for i in range(2)]
    for name in owners:
        body = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name},
            "addressType": "IPv4",
            "endpoints": [],
        }
        await request(kube.api, "POST", slices, body=body)
    held = LeaseClient(kube.api, ns, f"{cfg.leader.lease_name}-shard-1")
    await held.create(LeaseRecord(holder="owner-1", duration_s=30), timeout_s=10)
    config = _write_config(
        tmp_path / "controller.yaml",
        release,
        cleanup={"stop_timeout_s": 1.0, "poll_interval_s": 0.1},
    )

    # an owner still holds shard 1: nothing is removed
    code, _, err = await _finish(_cleanup(hook, config))
    assert code == 1 and f"{cfg.leader.lease_name}-shard-1" in err, err
    assert (await get_node(kube.api, nodes[0]))["metadata"]["labels"][shard_label] == "0"

    record = await held.get(timeout_s=10)
    assert record is not None
    await held.update(replace(record, holder=""), timeout_s=10)  # released on its stop
    code, out, err = await _finish(_cleanup(hook, config))
    assert code == 0, err
    counts = json.loads(out.strip().splitlines()[-1])
    for name in nodes:
        labels = (await get_node(kube.api, name))["metadata"]["labels"]
        assert shard_label not in labels and labels["team"] == "ml"
    assert counts["labels"] >= 2 and counts["endpoint_slices"] == 2, counts
    assert counts["configmaps"] == 3, counts
    for name in configmaps:
        assert not await _exists(kube, f"/api/v1/namespaces/{ns}/configmaps/{name}")
    for name in owners:
        assert not await _exists(kube, f"{slices}/{name}")
