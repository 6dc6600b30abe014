"""Issue 2, test 3: kwok readies a fake GPU node, kube-scheduler binds a GPU pod, kwok runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from localkube.kwok import Kwok
from localkube.objects import GPU_RESOURCE, create_gpu_node, create_namespace, create_pod, wait_for
from localkube.scheduler import Scheduler

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


async def test_kwok_gpu_node_runs_scheduled_gpu_pod(
    api_client: client.ApiClient,
    kwok: Kwok,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    core = client.CoreV1Api(api_client)
    node_name, ns = unique_name("gpu"), unique_name("ns")
    # A private profile name and a label only this node has: other tests' nodes and
    # schedulers sharing the cluster cannot take part.
    scheduler = kube_scheduler(scheduler_name=unique_name("sched"))
    pin = {"localkube.test/pin": node_name}
    await create_gpu_node(api_client, node_name, gpus=8, labels=pin)
    try:

        async def node_ready() -> Any:
            node = await core.read_node(node_name)
            return node if _ready(node) else None

        node = await wait_for(node_ready, what=f"kwok to make {node_name} Ready", timeout_s=WAIT_S)
        assert node.status.allocatable[GPU_RESOURCE] == "8"

        await create_namespace(api_client, ns)
        await create_pod(
            api_client,
            ns,
            "trainer",
            gpus=1,
            node_selector=pin,
            scheduler_name=scheduler.scheduler_name,
        )

        async def running() -> Any:
            pod = await core.read_namespaced_pod("trainer", ns)
            return pod if pod.status.phase == "Running" else None

        pod = await wait_for(running, what="the GPU pod to run", timeout_s=WAIT_S)
        assert pod.spec.node_name == node_name
        assert pod.spec.containers[0].resources.limits[GPU_RESOURCE] == "1"
        scheduled = [c for c in pod.status.conditions if c.type == "PodScheduled"]
        assert scheduled and scheduled[0].status == "True"
    finally:
        await core.delete_node(node_name)
