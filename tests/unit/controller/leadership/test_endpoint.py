"""The leader's endpoint for the controller's Service: the slice it writes, when it is wired
in, and the replica readiness that no longer depends on leadership."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.app import Controller
from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.leadership.endpoint import endpoint_slice, slice_name
from gpuhealth.controller.leadership.work import POD_IP_ENV
from gpuhealth.controller.names import ENDPOINT_SLICE_MANAGER
from gpuhealth.controller.settings import load_config


def controller(**over: object) -> Controller:
    cfg = load_config(None, {"kubeconfig": "unused", **over})
    return build_controller(cfg, None, identity="ctl-0")  # type: ignore[arg-type]


@pytest.mark.parametrize(("ip", "family"), [("10.244.0.7", "IPv4"), ("fd00::7", "IPv6")])
def test_the_slice_points_the_service_at_this_pod(ip: str, family: str) -> None:
    body = endpoint_slice(
        namespace="gh",
        service="gh-controller",
        service_uid="u-1",
        pod_name="ctl-0",
        pod_ip=ip,
        port=8080,
        port_name="http",
    )
    meta = body["metadata"]
    assert meta["name"] == slice_name("gh-controller") == "gh-controller-leader"
    assert meta["labels"] == {
        "kubernetes.io/service-name": "gh-controller",
        "endpointslice.kubernetes.io/managed-by": ENDPOINT_SLICE_MANAGER,
    }
    # Owned by the Service: deleting it (helm uninstall) deletes the slice.
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Service", "name": "gh-controller", "uid": "u-1"}
    ]
    assert body["addressType"] == family
    (endpoint,) = body["endpoints"]
    assert endpoint["addresses"] == [ip] and endpoint["conditions"] == {"ready": True}
    assert endpoint["targetRef"] == {"kind": "Pod", "name": "ctl-0", "namespace": "gh"}
    # Matched to the Service's port by name.
    assert body["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


async def test_leader_work_publishes_the_endpoint_only_when_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(POD_IP_ENV, "10.244.0.9")
    without = controller()
    assert not [t for t in without.parts.leader_work.tasks if t.name.startswith("endpoint-")]
    with_service = controller(leader={"service": "gh-controller"}, listen="0.0.0.0:9000")
    assert [t.name for t in with_service.parts.leader_work.tasks][-1] == "endpoint-gh-controller"


@pytest.mark.parametrize("value", [None, "", "not-an-ip"])
async def test_a_published_endpoint_needs_the_pod_ip(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(POD_IP_ENV, raising=False)
    else:
        monkeypatch.setenv(POD_IP_ENV, value)
    with pytest.raises(ConfigError, match="POD_IP"):
        controller(leader={"service": "gh-controller"})


async def test_a_synced_standby_is_ready_as_a_replica_but_not_as_the_leader() -> None:
    ctl = controller()
    async with TestClient(TestServer(ctl.web_app())) as client:
        assert (await client.get("/readyz/replica")).status == 503  # cache not synced yet
        ctl.parts.cache.synced.set()
        resp = await client.get("/readyz/replica")
        assert resp.status == 200
        assert await resp.json() == {"ok": True, "synced": True, "leader": False}
        assert (await client.get("/readyz")).status == 503
