"""The Helm chart on a real node, as a user installs it: the image `make image` built
(imported, never pulled), the chart's own defaults for image, RBAC, tokens and Services.

The tests run in order against one release: install, the agent's stream, a GPU workload
attributed and flagged idle, an XID taint and its recovery, leader hand-over, upgrade,
uninstall. Timings (install to Ready, XID line to taint) go to the terminal summary and to
``$GPUHEALTH_E2E_TIMINGS`` when set.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from localkube.helm import Helm
from localkube.images import archive_image_names
from localkube.kubelet import ROOT_DIR as KUBELET_ROOT
from localkube.node import Node, NodeSettings
from localkube.process import LocalKubeError
from localkube.restapi import AdminApi
from tests.e2e.chart_env import (
    CHART,
    GPUS,
    IDLE_WINDOW_S,
    NAMESPACE,
    PREFIX,
    RELEASE,
    SCENARIO,
    SEED,
    Cluster,
    chart_values,
    http_text,
    wait_for,
)

pytestmark = pytest.mark.e2e

WORKLOAD_NS = "e2e-work"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def cluster(
    node_assets: Path,
    image_archive: Path,
    tmp_path_factory: pytest.TempPathFactory,
    log: Callable[[str], None],
) -> Iterator[Cluster]:
    scenario = tmp_path_factory.mktemp("scenario") / "scenario.yaml"
    scenario.write_text(json.dumps(SCENARIO))
    settings = NodeSettings(images=(image_archive,), sim_scenario=scenario, sim_seed=SEED)
    with Node(node_assets, settings, log=log) as node:
        api = AdminApi(node.control_plane)  # type: ignore[arg-type]
        helm = Helm(node_assets / "helm", node.kubeconfig, node.workdir / "helm")
        yield Cluster(node, api, helm)
    assert node.cleanup_problems == []
    _report()


def _report() -> None:
    line = ", ".join(f"{k} {v:.2f}s" for k, v in TIMINGS.items())
    print(f"\nreal-node timings: {line}")
    out = os.environ.get("GPUHEALTH_E2E_TIMINGS")
    if out:
        Path(out).write_text(json.dumps(TIMINGS, indent=2))


def _deployment(c: Cluster) -> dict[str, Any]:
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}-controller"
    found: dict[str, Any] = c.api.get(path)
    return found


def _daemonset(c: Cluster) -> dict[str, Any]:
    found: dict[str, Any] = c.api.get(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}-agent"
    )
    return found


def _ready(c: Cluster) -> bool:
    ds, dep = _daemonset(c)["status"], _deployment(c)["status"]
    return (
        ds.get("desiredNumberScheduled") == 1
        and ds.get("numberReady") == 1
        and dep.get("readyReplicas") == 2
        and dep.get("updatedReplicas") == 2
    )


def test_install_runs_the_released_image_and_becomes_ready(
    cluster: Cluster, image_archive: Path
) -> None:
    began = time.monotonic()
    cluster.helm.install(RELEASE, CHART, NAMESPACE, chart_values(cluster.node))
    # helm --wait lets a DaemonSet with maxUnavailable 10% of one node count as ready with
    # none ready: wait for every pod here.
    wait_for(lambda: _ready(cluster), "the agent and both controller replicas Ready")
    TIMINGS["helm install to Ready"] = time.monotonic() - began
    assert _deployment(cluster)["spec"]["replicas"] == 2
    # The chart's default image is exactly what `make image` built and the node imported.
    (built,) = archive_image_names(image_archive)
    for pod in cluster.running("agent") + cluster.running("controller"):
        (ctr,) = pod["spec"]["containers"]
        assert (ctr["image"], ctr["imagePullPolicy"]) == (built, "Never")
    (ctl,) = cluster.running("controller")[:1]
    assert ctl["spec"]["securityContext"]["runAsNonRoot"] is True


def test_no_key_material_reaches_the_agents_node(cluster: Cluster) -> None:
    """On the real node: the agent's pod mounts no Secret (its controller CA comes from a
    ConfigMap that holds the CA alone), and nothing the kubelet put in the agent pod's
    volumes holds a private key. A GPU node's kubelet can read every Secret its pods mount;
    with the controller's key there, any GPU node could impersonate the controller that
    sends reset and reboot orders."""
    (agent,) = cluster.running("agent")
    pod = agent["spec"]
    for v in pod["volumes"]:
        assert "secret" not in v, v
        assert not [s for s in (v.get("projected") or {}).get("sources", []) if "secret" in s], v
    ca = {v["name"]: v for v in pod["volumes"]}["controller-ca"]["configMap"]
    assert ca["name"] == f"{RELEASE}-controller-ca"
    volumes = KUBELET_ROOT / "pods" / agent["metadata"]["uid"] / "volumes"
    assert volumes.is_dir(), volumes
    assert not list(volumes.glob("kubernetes.io~secret")), "a Secret volume on the node"
    keys = [
        f
        for f in volumes.rglob("*")
        if f.is_file() and not f.is_symlink() and b"PRIVATE KEY" in f.read_bytes()[: 1 << 20]
    ]
    assert keys == [], f"private keys in the agent pod's volumes: {keys}"
    trusted = next(volumes.rglob("ca.crt"))
    assert b"BEGIN CERTIFICATE" in trusted.read_bytes()


def test_agent_streams_to_the_leader_through_the_service_with_its_token(cluster: Cluster) -> None:
    holder = wait_for(cluster.lease_holder, "a leader")
    assert holder in {p["metadata"]["name"] for p in cluster.running("controller")}

    def connected() -> dict[str, Any] | None:
        nodes = {n["name"]: n for n in cluster.fleet()["nodes"]}
        n = nodes.get(cluster.node.name)
        return n if n and n["connected"] and n["has_snapshot"] else None

    node = wait_for(connected, "the agent's stream at the leader")
    # The GPUs the agent reports are the ones the kubelet's device plugin registered.
    assert sorted(g["uuid"] for g in node["gpus"]) == sorted(cluster.node.gpu_uuids)
    assert len(node["gpus"]) == GPUS


# Runs in the agent's container: POSTs ExtenderArgs to the extender behind the controller's
# Service, as kube-scheduler does with the shipped configuration, then reads the metrics the
# same way; prints both as one JSON document, base64-encoded (the exec client would turn a
# JSON answer into a Python repr).
EXTENDER_CALL = """
import base64, json, ssl, sys, urllib.request
base, ca, node, token = sys.argv[1:5]
ctx = ssl.create_default_context(cafile=ca) if base.startswith("https") else None
pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
body = json.dumps({"Pod": pod, "NodeNames": [node, "no-agent-node"]}).encode()
headers = {"Content-Type": "application/json"}
req = urllib.request.Request(base + "/scheduler/filter", data=body, headers=headers)
answer = json.loads(urllib.request.urlopen(req, context=ctx, timeout=10).read())
auth = {"Authorization": "Bearer " + token}  # reads (/metrics too) are authorized
scrape = urllib.request.Request(base + "/metrics", headers=auth)
metrics = urllib.request.urlopen(scrape, context=ctx, timeout=10).read().decode()
print(base64.b64encode(json.dumps({"answer": answer, "metrics": metrics}).encode()).decode())
"""


def test_the_scheduler_extender_answers_through_the_service(cluster: Cluster) -> None:
    """One filter call through the controller's Service (from a pod, as the agents reach it):
    the extender behind every middleware of the chart's controller, over the chart's TLS."""
    (agent,) = cluster.running("agent")
    (ctr,) = agent["spec"]["containers"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in ctr["args"] if "=" in a)
    stream_url = flags["controller-url"]  # ws(s)://<service>.<ns>.svc:<port>/v1/stream
    base = stream_url.replace("ws", "http", 1).removesuffix("/v1/stream")
    assert ".svc:" in base
    ca = flags.get("controller-ca-file", "")
    token = cluster.reader_token()
    command = ["python3", "-c", EXTENDER_CALL, base, ca, cluster.node.name, token]
    raw = asyncio.run(_exec(cluster.node.kubeconfig, agent["metadata"]["name"], command))
    try:
        out = json.loads(base64.b64decode(raw))
    except ValueError:
        raise AssertionError(f"the call in the agent's container printed: {raw!r}") from None
    assert out["answer"].get("Error", "") == "", out["answer"]
    assert out["answer"]["NodeNames"] == [cluster.node.name, "no-agent-node"]
    # The Service leads to the leader, which counted the call.
    assert 'gpuhealth_extender_requests_total{result="ok",verb="filter"} 1.0' in out["metrics"]


def test_workload_gpu_is_attributed_via_podresources_and_flagged_idle(cluster: Cluster) -> None:
    api = cluster.api
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": WORKLOAD_NS}})
    pod = {
        "metadata": {"name": "trainer"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.node.pause_name,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    api.request("POST", f"/api/v1/namespaces/{WORKLOAD_NS}/pods", pod)
    wait_for(
        lambda: (
            (api.get(f"/api/v1/namespaces/{WORKLOAD_NS}/pods/trainer") or {})
            .get("status", {})
            .get("phase")
            == "Running"
        ),
        "the workload to run",
    )
    records = cluster.node.device_plugin.allocations_file.read_text().splitlines()  # type: ignore[union-attr]
    (uuid,) = json.loads(records[-1])["devices"]

    (agent,) = cluster.running("agent")
    metrics_url = f"http://{agent['status']['podIP']}:9455/metrics"

    def attributed() -> bool:
        text = http_text(metrics_url)
        return any(
            line.startswith("gpuhealth_gpu_utilization_ratio{")
            and f'uuid="{uuid}"' in line
            and f'namespace="{WORKLOAD_NS}"' in line
            and 'pod="trainer"' in line
            for line in text.splitlines()
        )

    wait_for(attributed, "the agent to attribute the GPU to the pod (kubelet PodResources)")

    def flagged() -> dict[str, Any] | None:
        p = api.get(f"/api/v1/namespaces/{WORKLOAD_NS}/pods/trainer")
        events = api.get(
            f"/api/v1/namespaces/{WORKLOAD_NS}/events"
            "?fieldSelector=involvedObject.name%3Dtrainer,reason%3DGPUIdle"
        )
        if f"{PREFIX}/idle-since" in (p["metadata"].get("annotations") or {}) and events["items"]:
            return p
        return None

    wait_for(flagged, "the idle flag (annotation and GPUIdle Event)", timeout_s=IDLE_WINDOW_S + 60)


def _xid_line(pci: str = "0000:18:00") -> str:
    return (
        f"<3>[ 1234.567890] NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python3, "
        "GPU has fallen off the bus.\n"
    )


def _inject_xid_and_wait_for_taint(cluster: Cluster) -> float:
    kmsg = cluster.node.host_path("kmsg")
    began = time.monotonic()
    with kmsg.open("a") as f:
        f.write(_xid_line())
    taint = wait_for(
        lambda: next((t for t in cluster.our_taints() if t["key"] == f"{PREFIX}/unhealthy"), None),
        "the unhealthy taint",
        timeout_s=60,
    )
    elapsed = time.monotonic() - began
    assert (taint["value"], taint["effect"]) == ("xid-79", "NoSchedule")
    return elapsed


async def _exec(kubeconfig: Path, pod: str, command: list[str]) -> str:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    async with WsApiClient(configuration=cfg) as ws:
        out: str = await client.CoreV1Api(ws).connect_get_namespaced_pod_exec(
            pod, NAMESPACE, command=command, stderr=True, stdout=True, stdin=False, tty=False
        )
        return out


def _operator_clear(cluster: Cluster) -> None:
    """What the runbook says: ``kubectl exec`` into the agent pod, ``gpuhealth-agent clear``."""
    (agent,) = cluster.running("agent")
    out = asyncio.run(
        _exec(
            cluster.node.kubeconfig,
            agent["metadata"]["name"],
            ["gpuhealth-agent", "clear", "--gpu", "all", "--reason", "e2e: reseated"],
        )
    )
    # The agent names the GPU it cleared (GPU 0, PCI 0000:18:00, held XID 79).
    assert re.search(r"GPU 0 GPU-[0-9a-f-]+: cleared .*xid-79", out), out
    wait_for(lambda: cluster.our_taints() == [], "the taint to go", timeout_s=60)


def test_xid_line_taints_the_node_and_an_operator_clear_untaints_it(cluster: Cluster) -> None:
    assert cluster.our_taints() == []
    TIMINGS["XID line to taint"] = _inject_xid_and_wait_for_taint(cluster)
    _operator_clear(cluster)


def _agent_at_leader(cluster: Cluster, leader: str) -> bool:
    doc = cluster.fleet()
    return (
        bool(doc["leader"])
        and any(n["name"] == cluster.node.name and n["connected"] for n in doc["nodes"])
        and cluster.lease_holder() == leader
    )


def _new_leader(cluster: Cluster, old: str, since: float) -> str | None:
    """A leader other than ``old``, or ``old`` again renewing the Lease after ``since`` (a
    crashed container restarts under its pod's name and takes its Lease back), whose pod is
    Ready."""
    lease = cluster.api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}-controller"
    )
    spec = (lease or {}).get("spec", {})
    holder = spec.get("holderIdentity")
    ready = {
        p["metadata"]["name"]
        for p in cluster.running("controller")
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    }
    if not holder or holder not in ready:
        return None
    if holder != old:
        return str(holder)
    renewed = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    return str(holder) if renewed.timestamp() > since else None


def _after_failover(cluster: Cluster, old: str, began: float, wall: float, what: str) -> None:
    leader = wait_for(lambda: _new_leader(cluster, old, wall), "a new leader", timeout_s=120)
    TIMINGS[f"{what}: new leader"] = time.monotonic() - began
    wait_for(
        lambda: _agent_at_leader(cluster, leader), "the agent at the new leader", timeout_s=120
    )
    TIMINGS[f"{what}: agent reconnected"] = time.monotonic() - began
    # The new leader acts: a fault taints the node, the operator's clear lifts it.
    TIMINGS[f"XID line to taint ({what})"] = _inject_xid_and_wait_for_taint(cluster)
    _operator_clear(cluster)


def test_killing_the_leader_pod_hands_over(cluster: Cluster) -> None:
    old = wait_for(cluster.lease_holder, "a leader")
    began, wall = time.monotonic(), time.time()
    cluster.api.delete(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{old}",
        {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )
    _after_failover(cluster, old, began, wall, "leader pod deleted")
    assert cluster.lease_holder() != old


def test_a_crashed_leader_is_replaced(cluster: Cluster) -> None:
    """SIGKILL: no clean hand-over, the Lease and the published endpoint stay behind."""
    old = wait_for(cluster.lease_holder, "a leader")
    pod = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{old}")
    container = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    pid = cluster.node.containerd.task_pids()[container]  # type: ignore[union-attr]
    began, wall = time.monotonic(), time.time()
    os.kill(pid, signal.SIGKILL)
    _after_failover(cluster, old, began, wall, "leader crashed")


def _rolled_out(c: Cluster, before: set[str]) -> bool:
    dep, ds = _deployment(c), _daemonset(c)
    d, s = dep["status"], ds["status"]
    pods = {p["metadata"]["name"] for p in c.running("agent") + c.running("controller")}
    return (
        d.get("observedGeneration") == dep["metadata"]["generation"]
        and d.get("updatedReplicas") == 2
        and d.get("readyReplicas") == 2
        and d.get("replicas") == 2
        and s.get("observedGeneration") == ds["metadata"]["generation"]
        and s.get("updatedNumberScheduled") == 1
        and s.get("numberReady") == 1
        and len(pods) == 3
        and not pods & before
    )


def test_upgrade_with_changed_values_rolls_out_and_keeps_working(cluster: Cluster) -> None:
    before = {
        p["metadata"]["name"] for p in cluster.running("agent") + cluster.running("controller")
    }
    values = chart_values(
        cluster.node,
        agent={"config": {"log_level": "debug"}},
        controller={"config": {"idle": {"window_s": 2 * IDLE_WINDOW_S}}},
    )
    tls_secret = f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-controller-tls"
    tls_before = cluster.api.get(tls_secret)["data"]
    began = time.monotonic()
    cluster.helm.upgrade(RELEASE, CHART, NAMESPACE, values)
    # Both replicas are Ready as standby or leader, so the rolling update completes.
    wait_for(lambda: _rolled_out(cluster, before), "the upgrade to roll out", timeout_s=180)
    TIMINGS["helm upgrade to Ready"] = time.monotonic() - began
    assert [r["status"] for r in cluster.helm.history(RELEASE, NAMESPACE)] == [
        "superseded",
        "deployed",
    ]
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{RELEASE}-agent")
    assert yaml.safe_load(cm["data"]["agent.yaml"])["log_level"] == "debug"
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{RELEASE}-controller")
    assert yaml.safe_load(cm["data"]["controller.yaml"])["idle"]["window_s"] == 2 * IDLE_WINDOW_S
    # The generated CA and certificate are kept (lookup): the agents' CA still fits.
    assert cluster.api.get(tls_secret)["data"] == tls_before

    # The new agent reaches the new leader through the Service, and faults still taint.
    holder = wait_for(cluster.lease_holder, "a leader")
    assert holder not in before
    wait_for(
        lambda: any(
            n["name"] == cluster.node.name and n["connected"] for n in cluster.fleet()["nodes"]
        ),
        "the upgraded agent's stream at the leader",
    )
    TIMINGS["XID line to taint (after upgrade)"] = _inject_xid_and_wait_for_taint(cluster)
    _operator_clear(cluster)
    # Everything above ran under the chart's RBAC: not one request was refused.
    logs = sorted(cluster.node.workdir.glob(f"kubelet/pod-logs/{NAMESPACE}_*/*/*.log"))
    assert logs
    for log_file in logs:
        text = log_file.read_text(errors="replace")
        assert not re.search(r"HTTP 403|\(403\)|forbidden", text, re.IGNORECASE), log_file


MERGE_PATCH = "application/merge-patch+json"
# PreferNoSchedule: a NoSchedule taint of someone else's would keep the cleanup hook's pod
# off the only node (the hook tolerates gpuhealth's taints and controller.tolerations only).
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "planned", "effect": "PreferNoSchedule"}


def _add_foreign_marks(cluster: Cluster) -> None:
    """A taint, label and annotation of someone else's on the node (the taint list is atomic:
    written whole, guarded by the resourceVersion, retried on a conflict)."""
    path = f"/api/v1/nodes/{cluster.node.name}"
    for _ in range(10):
        node = cluster.api.get(path)
        body = {
            "metadata": {
                "resourceVersion": node["metadata"]["resourceVersion"],
                "labels": {"example.com/team": "ml"},
                "annotations": {"example.com/owner": "infra"},
            },
            "spec": {"taints": [*node["spec"].get("taints", []), FOREIGN_TAINT]},
        }
        try:
            cluster.api.request("PATCH", path, body, content_type=MERGE_PATCH)
            return
        except LocalKubeError as exc:
            if "HTTP 409" not in str(exc):
                raise
    raise AssertionError("the node kept changing under the test's patch")


def _gpuhealth_keys(mapping: dict[str, str] | None) -> list[str]:
    return sorted(k for k in mapping or {} if k.startswith(PREFIX + "/"))


def _resources(api: AdminApi) -> list[tuple[str, str, bool]]:
    """(list path, kind, namespaced) of every listable resource the server serves; a
    namespaced one's path lists it in every namespace."""
    out = []
    groups = [("/api/v1", api.get("/api/v1"))]
    for group in api.get("/apis")["groups"]:
        gv = group["preferredVersion"]["groupVersion"]
        groups.append((f"/apis/{gv}", api.get(f"/apis/{gv}")))
    for prefix, doc in groups:
        for res in doc.get("resources", []):
            if "list" in res["verbs"] and "/" not in res["name"]:
                out.append((f"{prefix}/{res['name']}", res["kind"], bool(res["namespaced"])))
    return out


def _cleanup_hook_state(cluster: Cluster) -> str:
    """The hook's pods (phase, conditions) and their logs, for a failed uninstall."""
    lines = []
    for pod in cluster.pods("cleanup"):
        status = pod.get("status", {})
        lines.append(f"pod {pod['metadata']['name']}: {status.get('phase')}")
        lines += [f"  {c.get('type')}={c.get('status')} {c.get('message', '')}" for c in
                  status.get("conditions", [])]  # fmt: skip
    pattern = f"kubelet/pod-logs/{NAMESPACE}_{RELEASE}-cleanup-*/*/*.log"
    for log_file in sorted(cluster.node.workdir.glob(pattern)):
        lines.append(f"{log_file.name}:\n{log_file.read_text(errors='replace')[-3000:]}")
    return "\n".join(lines) or "no cleanup pod"


def test_uninstall_leaves_no_gpuhealth_objects(cluster: Cluster) -> None:
    api = cluster.api
    # What the controller writes, all at once: a taint (and its annotation), labels, the
    # GPUHealthy condition; the workload pod still carries the idle annotation.
    _inject_xid_and_wait_for_taint(cluster)
    _add_foreign_marks(cluster)
    node = api.get(f"/api/v1/nodes/{cluster.node.name}")
    assert _gpuhealth_keys(node["metadata"]["labels"]) == [
        f"{PREFIX}/healthy-gpus",
        f"{PREFIX}/state",
    ]
    assert f"{PREFIX}/applied-taints" in node["metadata"]["annotations"]
    assert any(c["type"] == "GPUHealthy" for c in node["status"]["conditions"])
    trainer = f"/api/v1/namespaces/{WORKLOAD_NS}/pods/trainer"
    wait_for(
        lambda: (
            _gpuhealth_keys(api.get(trainer)["metadata"].get("annotations"))
            == [f"{PREFIX}/idle-since"]
        ),
        "the idle flag on the workload (the upgraded controller's window)",
        timeout_s=2 * IDLE_WINDOW_S + 60,
    )

    began = time.monotonic()
    try:
        cluster.helm.uninstall(RELEASE, NAMESPACE)
    except LocalKubeError as exc:
        raise AssertionError(f"{exc}\n{_cleanup_hook_state(cluster)}") from exc
    TIMINGS["helm uninstall (pre-delete cleanup hook)"] = time.monotonic() - began
    wait_for(lambda: not cluster.pods("agent") + cluster.pods("controller"), "the pods to go")
    wait_for(lambda: not cluster.pods("cleanup"), "the cleanup hook's pod to go")

    # The node: nothing of gpuhealth's; everything of someone else's.
    node = api.get(f"/api/v1/nodes/{cluster.node.name}")
    assert cluster.our_taints() == []
    assert FOREIGN_TAINT in node["spec"]["taints"]
    assert _gpuhealth_keys(node["metadata"]["labels"]) == []
    assert node["metadata"]["labels"]["example.com/team"] == "ml"
    assert _gpuhealth_keys(node["metadata"]["annotations"]) == []
    assert node["metadata"]["annotations"]["example.com/owner"] == "infra"
    assert {c["type"] for c in node["status"]["conditions"]} >= {"Ready", "MemoryPressure"}
    assert all(c["type"] != "GPUHealthy" for c in node["status"]["conditions"])
    assert _gpuhealth_keys(api.get(trainer)["metadata"].get("annotations")) == []
    api.delete(f"/api/v1/namespaces/{WORKLOAD_NS}")

    # The release's namespace holds only what Kubernetes puts in every namespace.
    expected = {("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")}
    left = set()
    for path, kind, namespaced in _resources(api):
        if not namespaced or kind == "Event":  # Events expire by themselves (a record)
            continue
        base, plural = path.rsplit("/", 1)
        for item in (api.get(f"{base}/namespaces/{NAMESPACE}/{plural}") or {}).get("items", []):
            left.add((kind, item["metadata"]["name"]))
    assert left == expected

    # Anywhere in the cluster, nothing of the release's and nothing named after gpuhealth,
    # but the namespace Helm created (helm uninstall never deletes one) and the GPURemediation
    # and GPUIncident CRDs, kept on purpose (helm.sh/resource-policy: keep: their records, the
    # fleet's history, outlive a release; a later install adopts the open incidents).
    crd = "gpuremediations.gpuhealth.io"
    incidents_crd = "gpuincidents.gpuhealth.io"
    instance = f"?labelSelector=app.kubernetes.io/instance%3D{RELEASE}"
    left = set()
    for path, kind, _ in _resources(api):
        if kind == "Event":
            continue
        labelled = (api.get(path + instance) or {}).get("items", [])
        named = [
            i
            for i in (api.get(path) or {}).get("items", [])
            if "gpuhealth" in i["metadata"]["name"]
        ]
        for item in labelled + named:
            left.add((kind, item["metadata"]["name"]))
    assert left == {
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", crd),
        ("CustomResourceDefinition", incidents_crd),
        ("APIService", "v1alpha1.gpuhealth.io"),  # the API server's own, for the CRD's group
    }
    for name in (crd, incidents_crd):
        kept = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert api.get("/apis/gpuhealth.io/v1alpha1/gpuremediations")["items"] == []
