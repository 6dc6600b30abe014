"""The leader's endpoint against a real API server: the slice is created, owned by the
Service, moved by the next leader, repaired after an edit, and a missing Service is logged
rather than fatal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import NotFoundError, request
from gpuhealth.controller.leadership.endpoint import LeaderEndpoint, slice_name
from localkube.objects import create_namespace
from tests.support.clock import FakeClock
from tests.support.wait import until

pytestmark = pytest.mark.integration


async def _service(api: Any, namespace: str, name: str) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080}]},
    }
    created: dict[str, Any] = await request(
        api, "POST", f"/api/v1/namespaces/{namespace}/services", body=body
    )
    return created


async def _slice(api: Any, namespace: str, service: str) -> dict[str, Any]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{slice_name(service)}"
    found: dict[str, Any] = await request(api, "GET", path)
    return found


def _endpoint(api: Any, namespace: str, service: str, pod: str, ip: str) -> LeaderEndpoint:
    return LeaderEndpoint(
        api, namespace=namespace, service=service, pod_name=pod, pod_ip=ip, port=8080
    )


async def test_the_leader_points_the_service_at_itself_and_the_next_one_takes_it_over(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("le")
    await create_namespace(api_client, ns)
    svc = await _service(api_client, ns, "ctl")

    await _endpoint(api_client, ns, "ctl", "ctl-a", "10.9.0.5").publish()
    first = await _slice(api_client, ns, "ctl")
    assert first["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
    assert first["metadata"]["labels"]["kubernetes.io/service-name"] == "ctl"
    assert [e["addresses"] for e in first["endpoints"]] == [["10.9.0.5"]]
    assert first["endpoints"][0]["targetRef"]["name"] == "ctl-a"

    # A new leader replaces the address (one endpoint: the leader, never both).
    await _endpoint(api_client, ns, "ctl", "ctl-b", "10.9.0.6").publish()
    second = await _slice(api_client, ns, "ctl")
    assert [e["addresses"] for e in second["endpoints"]] == [["10.9.0.6"]]
    assert second["metadata"]["uid"] == first["metadata"]["uid"]


async def test_withdraw_empties_only_its_own_endpoint(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("le")
    await create_namespace(api_client, ns)
    await _service(api_client, ns, "ctl")
    old, new = (
        _endpoint(api_client, ns, "ctl", p, ip) for p, ip in (("a", "10.9.1.1"), ("b", "10.9.1.2"))
    )
    await old.withdraw()  # no slice yet: nothing to do
    await old.publish()
    await new.withdraw()  # not its address: left alone
    assert await _has(api_client, ns, "10.9.1.1")
    await new.publish()
    await old.withdraw()  # a newer leader's slice: left alone
    assert await _has(api_client, ns, "10.9.1.2")
    await new.withdraw()
    assert (await _slice(api_client, ns, "ctl"))["endpoints"] in (None, [])


async def test_run_repairs_an_edited_slice_and_survives_a_missing_service(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    ns = unique_name("le")
    await create_namespace(api_client, ns)
    clock = FakeClock()
    gone = LeaderEndpoint(
        api_client, namespace=ns, service="nope", pod_name="p", pod_ip="10.9.0.7", port=8080,
        interval_s=1.0, clock=clock,
    )  # fmt: skip
    task = asyncio.create_task(gone.run())
    await asyncio.sleep(0.5)
    assert not task.done(), "a missing Service must not end the leader work"
    task.cancel()

    await _service(api_client, ns, "ctl")
    endpoint = LeaderEndpoint(
        api_client, namespace=ns, service="ctl", pod_name="p", pod_ip="10.9.0.8", port=8080,
        interval_s=1.0, clock=clock,
    )  # fmt: skip
    task = asyncio.create_task(endpoint.run())
    try:
        await until(lambda: _has(api_client, ns, "10.9.0.8"), "the slice")
        path = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{slice_name('ctl')}"
        edit = {"endpoints": [{"addresses": ["10.9.9.9"], "conditions": {"ready": True}}]}
        await request(
            api_client, "PATCH", path, body=edit, content_type="application/merge-patch+json"
        )
        await clock.advance_and_settle(1.0)
        await until(lambda: _has(api_client, ns, "10.9.0.8"), "the repaired slice")
    finally:
        task.cancel()
    # Cancelled (lead lost, shutdown): the leader takes its address out on the way.
    await asyncio.gather(task, return_exceptions=True)
    assert (await _slice(api_client, ns, "ctl"))["endpoints"] in (None, [])


async def _has(api: Any, ns: str, ip: str) -> bool:
    try:
        found = await _slice(api, ns, "ctl")
    except NotFoundError:
        return False
    return [e["addresses"] for e in found.get("endpoints") or []] == [[ip]]


def test_a_bad_pod_ip_is_refused_at_once() -> None:
    with pytest.raises(ValueError):
        LeaderEndpoint(
            None,  # type: ignore[arg-type]  # refused before it is used
            namespace="n",
            service="s",
            pod_name="p",
            pod_ip="",
            port=1,
        )
