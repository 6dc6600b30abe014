"""Idle allocations against the real API server: Event GPUIdle on the Pod, the annotation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpuhealth.controller.idle import IdleSettings
from gpuhealth.controller.idle.pod_writes import PodApi
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.protocol import AllocationUsage
from localkube.objects import create_namespace, create_pod
from tests.support.clock import FakeClock

pytestmark = pytest.mark.integration

KEY = "gpuhealth.io/idle-since"


def usage(pod: str, ns: str, ratio: float) -> AllocationUsage:
    return AllocationUsage(
        namespace=ns, pod=pod, container="main", gpu_uuid="GPU-7", utilization_ratio=ratio
    )


async def test_idle_pod_gets_event_and_annotation_and_loses_it_when_busy(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> None:
    core = client.CoreV1Api(api_client)
    ns = unique_name("idle")
    await create_namespace(api_client, ns)
    try:
        pod = await create_pod(api_client, ns, "notebook", node_name="gpu-node-7", gpus=1)
        clock = FakeClock()
        cfg = IdleSettings(window_s=600, max_gap_s=60, annotate=True, evaluate_interval_s=30)
        tracker = IdleTracker(cfg, clock, PodApi(api_client))
        for _ in range(62):
            tracker.observe("gpu-node-7", [usage("notebook", ns, 0.01)], {"GPU-7": "7"})
            clock.advance(10)
        tracker.evaluate()
        assert await tracker.flush() == 2

        events = await core.list_namespaced_event(
            ns, field_selector="involvedObject.name=notebook,reason=GPUIdle"
        )
        [ev] = events.items
        assert ev.involved_object.kind == "Pod"
        assert ev.involved_object.uid == pod.metadata.uid  # so kubectl describe pod lists it
        assert "GPU 7" in ev.message
        assert "gpu-node-7" in ev.message
        annotated = await core.read_namespaced_pod("notebook", ns)
        assert KEY in annotated.metadata.annotations

        tracker.observe("gpu-node-7", [usage("notebook", ns, 0.7)], {"GPU-7": "7"})
        tracker.evaluate()
        assert await tracker.flush() == 1
        cleared: Any = await core.read_namespaced_pod("notebook", ns)
        assert KEY not in (cleared.metadata.annotations or {})
        assert cleared.spec.node_name == "gpu-node-7"  # never evicted, never changed
    finally:
        await core.delete_namespace(ns)


async def test_writes_for_a_deleted_pod_are_harmless(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("idle")
    await create_namespace(api_client, ns)
    try:
        pods = PodApi(api_client)
        assert not await pods.create_event(ns, "gone", "GPUIdle", "x", FakeClock().now())
        assert not await pods.set_annotation(ns, "gone", KEY, None)
    finally:
        await client.CoreV1Api(api_client).delete_namespace(ns)
