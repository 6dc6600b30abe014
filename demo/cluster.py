"""The Kubernetes objects the demo needs, created through the real API server.

GPU nodes (kwok), the agents' namespace and ServiceAccount, one agent pod bound to each node
(its bound token carries the node name, as a DaemonSet pod's would) and the workload pods,
placed by kube-scheduler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from demo.plan import DEVICE_ANNOTATION, WORKLOAD_NAMESPACE, PodPlan
from localkube.objects import (
    create_gpu_node,
    create_namespace,
    create_service_account,
    pod_body,
    request_bound_token,
)

AGENT_NAMESPACE = "gpuhealth"
AGENT_SERVICE_ACCOUNT = "gpuhealth-agent"
AGENT_DAEMONSET = "gpuhealth-agent"
NO_NODE = {"gpuhealth.io/demo-daemonset": "none"}
AUDIENCE = "gpuhealth"
TOKEN_SECONDS = 3600
"""Bound-token lifetime: longer than any demo run."""


async def _exists_ok(create: Awaitable[Any]) -> None:
    try:
        await create
    except ApiException as exc:
        if exc.status != 409:
            raise


async def create_nodes(api: client.ApiClient, nodes: Sequence[str], gpus: int) -> None:
    await asyncio.gather(*(create_gpu_node(api, n, gpus=gpus) for n in nodes))


async def agent_daemonset_uid(api: client.ApiClient, namespace: str = AGENT_NAMESPACE) -> str:
    """A DaemonSet the agent pods of ``namespace`` belong to, as the chart's do: a drain never
    evicts a DaemonSet's pods (a label, which anyone can set, protects nothing). It runs nothing
    itself (its nodeSelector matches no node), and the pods made here are not its to manage
    (a reference that is not the controller's: its controller leaves them alone, and the
    garbage collector keeps them while it exists)."""
    apps = client.AppsV1Api(api)
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": AGENT_DAEMONSET, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": NO_NODE},
            "template": {
                "metadata": {"labels": NO_NODE},
                "spec": {
                    "nodeSelector": NO_NODE,
                    "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    try:
        ds = await apps.create_namespaced_daemon_set(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        ds = await apps.read_namespaced_daemon_set(AGENT_DAEMONSET, namespace)
    return str(ds.metadata.uid)


async def agent_tokens(
    api: client.ApiClient, nodes: Sequence[str], images: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An agent pod bound to each node, and its bound token (audience ``gpuhealth``).

    ``images``: node -> an image already on that node, for a real node whose kubelet runs
    the pod (kwok only pretends to)."""
    await _exists_ok(create_namespace(api, AGENT_NAMESPACE))  # a second call adds nodes
    await _exists_ok(create_service_account(api, AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT))
    core = client.CoreV1Api(api)
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": AGENT_DAEMONSET,
        "uid": await agent_daemonset_uid(api),
    }

    async def one(node: str) -> tuple[str, str]:
        body = pod_body(
            f"gpuhealth-agent-{node}", node_name=node, service_account=AGENT_SERVICE_ACCOUNT
        )
        # The chart's labels, and a DaemonSet owner: a drain never evicts the agent
        body["metadata"]["labels"] = {
            "app.kubernetes.io/name": "gpuhealth",
            "app.kubernetes.io/component": "agent",
        }
        body["metadata"]["ownerReferences"] = [owner]
        if images and node in images:
            (container,) = body["spec"]["containers"]
            container.update(image=images[node], imagePullPolicy="Never")
        pod = await core.create_namespaced_pod(AGENT_NAMESPACE, body)
        token = await request_bound_token(
            api,
            AGENT_NAMESPACE,
            AGENT_SERVICE_ACCOUNT,
            pod,
            AUDIENCE,
            expiration_seconds=TOKEN_SECONDS,
        )
        return node, token

    return dict(await asyncio.gather(*(one(n) for n in nodes)))


def write_tokens(tokens: Mapping[str, str], directory: Path) -> dict[str, Path]:
    """``directory/<node>.token`` for each token (mode 0600), as a projected volume would."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for node, token in tokens.items():
        path = directory / f"{node}.token"
        path.write_text(token)
        path.chmod(0o600)
        out[node] = path
    return out


async def create_workloads(api: client.ApiClient, pods: Sequence[PodPlan]) -> None:
    """The workload pods, pinned to their node by nodeSelector and bound by kube-scheduler."""
    await create_namespace(api, WORKLOAD_NAMESPACE)
    core = client.CoreV1Api(api)
    for job in sorted({p.job for p in pods if p.job}):
        await _create_job(api, WORKLOAD_NAMESPACE, job)
    for p in pods:
        body = pod_body(
            p.name,
            gpus=len(p.gpu_indices),
            node_selector={"kubernetes.io/hostname": p.node},
        )
        body["metadata"]["annotations"] = {
            DEVICE_ANNOTATION: ",".join(str(i) for i in p.gpu_indices)
        }
        if p.job:
            # The Job's name label only: an ownerReference would make kwok complete the pod,
            # and the Job's selector (its controller-uid) would let a real Job controller
            # (``--real-node``) adopt and, the Job being suspended, delete it.
            body["metadata"]["labels"] = {"batch.kubernetes.io/job-name": p.job}
        await _create_pod(core, WORKLOAD_NAMESPACE, body)


async def _create_job(api: client.ApiClient, namespace: str, name: str) -> None:
    """A suspended batch/v1 Job (its pods are the plan's, made here): the owner a job incident
    names."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                }
            },
        },
    }
    await client.BatchV1Api(api).create_namespaced_job(namespace, body)


SERVICE_ACCOUNT_WAIT_S = 30.0
"""With kube-controller-manager (``--real-node``) the ServiceAccount admission plugin is on:
a new namespace's pods are refused until the controller created its default account."""


async def _create_pod(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> None:
    deadline = time.monotonic() + SERVICE_ACCOUNT_WAIT_S
    while True:
        try:
            await core.create_namespaced_pod(namespace, body)
            return
        except ApiException as exc:
            no_account = exc.status == 403 and "serviceaccount" in str(exc.body).lower()
            if not no_account or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def node_taints(api: client.ApiClient) -> dict[str, list[dict[str, Any]]]:
    """Node name -> taints, as the API server has them now."""
    resp = await client.CoreV1Api(api).list_node()
    return {
        n.metadata.name: [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in (n.spec.taints or [])
        ]
        for n in resp.items
    }


async def annotated_nodes(api: client.ApiClient, key: str, value: str) -> set[str]:
    """Nodes carrying annotation ``key`` with ``value`` (``karpenter.sh/do-not-disrupt``)."""
    resp = await client.CoreV1Api(api).list_node()
    return {n.metadata.name for n in resp.items if (n.metadata.annotations or {}).get(key) == value}


async def workload_pods(api: client.ApiClient) -> list[Any]:
    resp = await client.CoreV1Api(api).list_namespaced_pod(WORKLOAD_NAMESPACE)
    return list(resp.items)


async def idle_flagged(api: client.ApiClient, pods: Sequence[Any], annotation: str) -> set[str]:
    """Workload pods the controller flagged idle: the annotation, or a ``GPUIdle`` Event."""
    flagged = {p.metadata.name for p in pods if annotation in (p.metadata.annotations or {})}
    events = await client.CoreV1Api(api).list_namespaced_event(
        WORKLOAD_NAMESPACE, field_selector="reason=GPUIdle"
    )
    flagged |= {e.involved_object.name for e in events.items if e.involved_object is not None}
    return flagged


WATCH_RETRY_S = 1.0
"""Pause before the node watch is opened again after an error."""


async def watch_node_taints(
    api: client.ApiClient, on_change: Callable[[str, list[dict[str, Any]]], None]
) -> None:
    """Every change of every Node's taints as the API server streams it (runs until
    cancelled): a taint that lives for less than a poll (a GPU reset by the remediation loop
    right after the fault) is still seen."""
    core = client.CoreV1Api(api)
    while True:
        try:
            async with watch.Watch().stream(core.list_node, timeout_seconds=60) as stream:
                async for event in stream:
                    node = event["object"]
                    taints = [
                        {"key": t.key, "value": t.value, "effect": t.effect}
                        for t in (node.spec.taints or [])
                    ]
                    on_change(node.metadata.name, taints)
        except (ApiException, aiohttp.ClientError, TimeoutError, ValueError):
            await asyncio.sleep(WATCH_RETRY_S)
