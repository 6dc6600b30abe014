"""One remediation episode on the real node, with real pods (issue 15).

The chart is installed with the loop on for GPU resets (``remediation.enabled``,
``remediation.resetGpu``), the agent's GPUs simulated (the chart's ``sim`` source: its
NVML answers the reset order's questions and its reset stands for ``nvidia-smi
--gpu-reset``). Two real pods, each holding one device-plugin GPU (``nvidia.com/gpu``); an
XID 48 (double-bit ECC error, RESET_GPU) for the first pod's GPU is written to the node's
kernel log (the agent's hostPath file). Then:

- a GPURemediation opens and the node gets the quarantine taint;
- the drain is partial: only the pod on the failed GPU is in scope, and a
  PodDisruptionBudget over it holds the drain (``pdb-blocked``, the pod keeps running: the
  Eviction API, never a delete) until the budget goes; then that pod alone is evicted, the
  other pod keeps running untouched;
- the reset order goes to the agent over its stream, the simulated reset clears the fault,
  the agent validates through a clean soak, a validation pod (the user's smoke test, here a
  shell of the gpuhealth image) runs on the quarantined node and succeeds, and the controller
  returns the node: phase Returned, every stage timestamped, no gpuhealth taint left;
- ``helm uninstall``: the pre-delete hook deletes the validation pod (its owner, the
  GPURemediation, is kept with its CRD, so the garbage collector never would).

Stage timings go to the terminal (``-s``) and to ``$GPUHEALTH_E2E_REMEDIATION_TIMINGS``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localkube.helm import Helm
from localkube.images import archive_image_names
from localkube.node import Node, NodeSettings
from localkube.restapi import AdminApi
from tests.e2e.chart_env import (
    CHART,
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

WORK = "e2e-remediation"
VALIDATION_NS = "e2e-validation"
EPISODES = "/apis/gpuhealth.io/v1alpha1/gpuremediations"
QUARANTINE = f"{PREFIX}/remediation"
SOAK_S = 3.0
STAGES = ("detected", "quarantined", "drained", "remediated", "validated", "returned")
TIMINGS: dict[str, float] = {}

VALUES: dict[str, Any] = {
    "remediation": {
        "enabled": True,
        "resetGpu": True,
        "validationPodNamespace": VALIDATION_NS,
        "agent": {"validation": {"check_interval_s": 0.5}},
    },
    "controller": {
        "config": {
            "remediation": {
                "reset_gpu": {"retry_s": 2, "order_timeout_s": 15},
                "drain": {"retry_s": 1, "timeout_s": 300},
                "validation": {"soak_s": SOAK_S, "report_grace_s": 30, "timeout_s": 300},
                "safety": {"max_fraction": 1.0},
                "quarantine_check_s": 0.5,
                "undelivered_retry_s": 1,
                "resync_s": 2,
            }
        }
    },
}


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
    line = ", ".join(f"{k} {v:.2f}s" for k, v in TIMINGS.items())
    print(f"\nreal-node remediation timings: {line}", file=sys.stderr)
    out = os.environ.get("GPUHEALTH_E2E_REMEDIATION_TIMINGS")
    if out:
        Path(out).write_text(json.dumps(TIMINGS, indent=2))


def _pod(name: str, node: Node) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": node.pause_name,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def _live(api: AdminApi, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = api.get(f"/api/v1/namespaces/{WORK}/pods/{name}")
    if pod is None or "deletionTimestamp" in pod["metadata"]:
        return None
    return pod if pod["status"].get("phase") == "Running" else None


def _attribution(metrics_url: str) -> dict[str, str]:
    """pod -> GPU UUID, as the agent attributes them (kubelet PodResources)."""
    out: dict[str, str] = {}
    for line in http_text(metrics_url).splitlines():
        if (
            not line.startswith("gpuhealth_gpu_utilization_ratio{")
            or f'namespace="{WORK}"' not in line
        ):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        out[labels["pod"].strip('"')] = labels["uuid"].strip('"')
    return out


def _xid48(pci: str) -> str:
    return (
        f"<3>[ 2345.678901] NVRM: Xid (PCI:{pci}): 48, pid=4242, name=python3, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.\n"
    )


def _pci(index: int) -> str:
    """The simulator's PCI address of GPU ``index`` (agent/sources/sim/source.py), as the driver
    writes it in an XID line."""
    domain, slot = divmod(index, 13)
    return f"{domain:04x}:{0x18 + 0x11 * slot:02x}:00"


def _episodes(api: AdminApi, node: str) -> list[dict[str, Any]]:
    items = (api.get(EPISODES) or {}).get("items", [])
    return [e for e in items if e["spec"]["nodeName"] == node]


def _values(node: Node, image_archive: Path) -> dict[str, Any]:
    """VALUES with the validation pod: a smoke test from the image `make image` built."""
    (image,) = archive_image_names(image_archive)
    smoke = {
        "name": "smoke",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", "echo gpu smoke test passed"],
    }
    pod = {"namespace": VALIDATION_NS, "spec": {"containers": [smoke]}, "timeout_s": 120}
    values = json.loads(json.dumps(VALUES))
    values["controller"]["config"]["remediation"]["validation"]["pod"] = pod
    return chart_values(node, **values)


def _validation_pods(api: AdminApi) -> list[dict[str, Any]]:
    selector = f"{PREFIX}/remediation-episode"
    found = api.get(f"/api/v1/namespaces/{VALIDATION_NS}/pods?labelSelector={selector}")
    return list((found or {}).get("items", []))


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_a_reset_episode_on_the_real_node_evicts_only_the_failed_gpus_pod(
    cluster: Cluster, image_archive: Path
) -> None:
    api, node = cluster.api, cluster.node
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": VALIDATION_NS}})
    began = time.monotonic()
    cluster.helm.install(RELEASE, CHART, NAMESPACE, _values(node, image_archive))
    wait_for(
        lambda: len(cluster.running("agent")) == 1 and len(cluster.running("controller")) == 2,
        "the agent and both controller replicas running",
        timeout_s=180,
    )
    TIMINGS["helm install to running"] = time.monotonic() - began

    # Two real pods, one device-plugin GPU each, both attributed by the agent.
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": WORK}})
    for name in ("victim", "bystander"):
        api.request("POST", f"/api/v1/namespaces/{WORK}/pods", _pod(name, node))
    victim = wait_for(lambda: _live(api, "victim"), "the victim pod running")
    bystander = wait_for(lambda: _live(api, "bystander"), "the bystander pod running")
    (agent,) = cluster.running("agent")
    metrics_url = f"http://{agent['status']['podIP']}:9455/metrics"

    def both() -> dict[str, str] | None:
        found = _attribution(metrics_url)
        return found if {"victim", "bystander"} <= found.keys() else None

    gpus = wait_for(
        both,
        "the agent to attribute both pods' GPUs (kubelet PodResources)",
    )
    assert gpus["victim"] != gpus["bystander"]
    failed = gpus["victim"]
    index = node.gpu_uuids.index(failed)

    # The victim's pod is protected by a budget: the drain must wait for it.
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "victim"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "victim"}}},
    }
    api.request("POST", f"/apis/policy/v1/namespaces/{WORK}/poddisruptionbudgets", pdb)
    assert _episodes(api, node.name) == []
    assert cluster.our_taints() == []

    # The fault: an XID 48 for the victim's GPU in the node's kernel log.
    injected, injected_wall = time.monotonic(), time.time()
    with node.host_path("kmsg").open("a") as f:
        f.write(_xid48(_pci(index)))

    def quarantined() -> dict[str, Any] | None:
        eps = _episodes(api, node.name)
        taints = {t["key"]: t for t in cluster.our_taints()}
        return eps[0] if eps and QUARANTINE in taints else None

    ep = wait_for(quarantined, "a GPURemediation and the quarantine taint", timeout_s=60)
    TIMINGS["XID line to quarantine taint"] = time.monotonic() - injected
    name = ep["metadata"]["name"]
    assert ep["spec"]["action"] == "reset-gpu"
    assert ep["spec"]["scope"] == "gpu"
    assert [g["uuid"] for g in ep["spec"]["fault"]["gpus"]] == [failed]
    taints = {t["key"]: t for t in cluster.our_taints()}
    assert (taints[QUARANTINE]["value"], taints[QUARANTINE]["effect"]) == (
        "reset-gpu",
        "NoSchedule",
    )

    def blocked() -> dict[str, Any] | None:
        (e,) = _episodes(api, node.name)
        waiting = e.get("status", {}).get("waitingPods", [])
        hit = [w for w in waiting if w["name"] == "victim" and w["reason"] == "pdb-blocked"]
        return e if e["status"].get("phase") == "Draining" and hit else None

    ep = wait_for(blocked, "the drain held by the PodDisruptionBudget", timeout_s=60)
    # Held, not deleted: the Eviction API refused, the pod still runs; only it is in scope.
    assert [w["name"] for w in ep["status"]["waitingPods"]] == ["victim"]
    assert ep["status"].get("evictedPods", []) == []
    assert _live(api, "victim")["metadata"]["uid"] == victim["metadata"]["uid"]  # type: ignore[index]
    held = time.monotonic()
    api.delete(f"/apis/policy/v1/namespaces/{WORK}/poddisruptionbudgets/victim")

    def returned() -> dict[str, Any] | None:
        (e,) = _episodes(api, node.name)
        status = e.get("status", {})
        done = status.get("phase") == "Returned" and status.get("times", {}).get("returned")
        return e if done and not cluster.our_taints() else None

    ep = wait_for(returned, "the episode Returned and the node untainted", timeout_s=180)
    TIMINGS["PDB lifted to returned"] = time.monotonic() - held
    TIMINGS["XID line to returned (wall, incl. the PDB hold)"] = time.monotonic() - injected

    status = ep["status"]
    assert ep["metadata"]["name"] == name and len(_episodes(api, node.name)) == 1
    times = {stage: _ts(status["times"][stage]) for stage in STAGES}
    assert list(times.values()) == sorted(times.values()), times
    evicted = [(p["namespace"], p["name"], p["uid"]) for p in status["evictedPods"]]
    assert evicted == [(WORK, "victim", victim["metadata"]["uid"])]
    assert status["order"]["state"] == "succeeded"
    # The validation pod ran on the quarantined node (tolerating the quarantine) and passed.
    (vpod,) = _validation_pods(api)
    assert status["validation"]["podName"] == vpod["metadata"]["name"]
    assert status["validation"]["podPassed"] is True
    assert vpod["spec"]["nodeName"] == node.name
    assert vpod["status"]["phase"] == "Succeeded"
    (owner,) = vpod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("GPURemediation", name)
    # The evicted pod is gone; the pod on the healthy GPU never moved.
    wait_for(lambda: api.get(f"/api/v1/namespaces/{WORK}/pods/victim") is None, "victim gone")
    still = _live(api, "bystander")
    assert still is not None and still["metadata"]["uid"] == bystander["metadata"]["uid"]
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
    # The agent reset the GPU (the simulator's reset) and its verdict is gone.
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in node.workdir.glob(f"kubelet/pod-logs/{NAMESPACE}_{RELEASE}-agent-*/*/*.log")
    )
    assert "gpu_reset" in logs
    assert not [t for t in cluster.our_taints() if t["key"] == f"{PREFIX}/unhealthy"]

    for a, b in itertools.pairwise(STAGES):
        TIMINGS[f"{a} -> {b}"] = times[b] - times[a]
    TIMINGS["detected -> returned"] = times["returned"] - times["detected"]
    TIMINGS["XID line written -> detected"] = times["detected"] - injected_wall


def test_uninstall_deletes_the_validation_pod_and_keeps_the_episode(cluster: Cluster) -> None:
    api = cluster.api
    (episode,) = _episodes(api, cluster.node.name)
    assert len(_validation_pods(api)) == 1
    began = time.monotonic()
    cluster.helm.uninstall(RELEASE, NAMESPACE)
    TIMINGS["helm uninstall (pre-delete cleanup hook)"] = time.monotonic() - began
    wait_for(lambda: not _validation_pods(api), "the validation pod deleted by the hook")
    # The record stays (the CRD is kept); nothing of gpuhealth's on the node.
    (kept,) = _episodes(api, cluster.node.name)
    assert kept["metadata"]["uid"] == episode["metadata"]["uid"]
    assert kept["status"]["phase"] == "Returned"
    assert cluster.our_taints() == []
