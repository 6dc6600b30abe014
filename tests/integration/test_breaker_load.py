"""The breaker is loaded before any leader work starts (issue 38, item 3), against the real
kube-apiserver, two controllers with the chart's identity and Lease, and a leader that dies.

The first leader taints one node, and the breaker (a budget of one) holds the other two: open,
stored in its ConfigMap. It is killed. The successor's reads of the ConfigMap fail, while its
writes would go through (``get`` is taken out of the release Role's rule for the ConfigMap;
``patch`` and ``create`` stay):

- ``403``: RBAC refuses them (a successor whose RBAC is not there yet);
- ``500``: the API server's authorizer fails on them (its own control plane, with a webhook
  authorizer behind RBAC at a closed port: what RBAC does not allow is asked there, and the
  failure is the API server's HTTP 500 — a read cannot be made to fail 500 otherwise on a
  healthy API server: admission webhooks see only writes).

Meanwhile the successor holds the Lease but is not ready (``/readyz`` 503), every failed read
is counted (``gpuhealth_circuit_breaker_load_errors_total{status}``), the held nodes stay
untainted though its agents report their faults, the tainted node keeps its taint, and the
ConfigMap is not written once (its resourceVersion does not move, though a write would be
allowed). Once ``get`` is back, the successor keeps the open breaker: ready, the held nodes
still untainted, the ConfigMap still ``open`` with the first leader's window.

The stored window holds the largest budget the breaker may have (``MAX_WINDOW``), as the real
API server's 1 MiB limit on a ConfigMap's data has it.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.breaker.store import (
    MAX_OPEN_POOLS,
    MAX_WINDOW,
    NODE_NAME_MAX,
    POOL_NAME_MAX,
    BreakerStore,
    OpenPool,
    StoredBreaker,
    WindowEntry,
    configmap_data,
)
from gpuhealth.controller.kube.rest import KubeError, NotFoundError, request
from localkube import ControlPlane, ControlPlaneSettings
from localkube.process import free_port
from tests.integration.controller_helpers import UNHEALTHY, Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import fault
from tests.support.wait import until

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"
FLOW = "/apis/flowcontrol.apiserver.k8s.io/v1"
SETTINGS = {
    "leader": {
        "enabled": True,  # the release's Lease
        "lease_duration_s": 4,
        "renew_deadline_s": 3.0,
        "retry_period_s": 1.0,
    },
    "breaker": {
        "max_fraction": 0.0,
        "min_nodes": 1,
        "sync_interval_s": 0.1,
        "load_backoff_s": 0.2,
        "load_backoff_max_s": 0.5,
    },
}
TAINTED = [(UNHEALTHY, "xid-79", "NoSchedule")]


def _load_errors(ctl: Controller, status: str) -> float:
    prefix = f'gpuhealth_circuit_breaker_load_errors_total{{status="{status}"}} '
    for line in generate_latest(ctl.parts.registry).decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def _failing_authorizer(path: Path) -> ControlPlaneSettings:
    """kube-apiserver with a webhook authorizer behind Node and RBAC that cannot be reached:
    a request RBAC does not allow is answered 500 instead of 403."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: authz\n  cluster:\n"
        f"    server: https://127.0.0.1:{free_port()}/authorize\n"
        "    insecure-skip-tls-verify: true\n"
        "users:\n- name: apiserver\n  user: {}\n"
        "contexts:\n- name: authz\n  context: {cluster: authz, user: apiserver}\n"
        "current-context: authz\n"
    )
    return ControlPlaneSettings(
        extra_apiserver_args=(
            "--authorization-mode=Webhook",  # after Node,RBAC
            f"--authorization-webhook-config-file={path}",
            "--authorization-webhook-version=v1",
        )
    )


@contextlib.asynccontextmanager
async def refusing(
    status: str, request: pytest.FixtureRequest, kube_assets: Path, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """A cluster where what RBAC does not allow is answered ``status``: ``500`` on a control
    plane of its own with the failing authorizer, anything else (403) on the session's."""
    if status != "500":
        async with cluster(request.getfixturevalue("control_plane")) as c:
            yield c
        return
    cp = ControlPlane(kube_assets, _failing_authorizer(tmp_path / "authz.kubeconfig"))
    await cp.astart()
    try:
        async with cluster(cp) as c:
            yield c
    finally:
        await cp.astop()


@pytest.fixture(params=["403", "500"])
async def refusal(
    request: pytest.FixtureRequest, kube_assets: Path, tmp_path: Path
) -> AsyncIterator[tuple[str, Cluster]]:
    """How the successor's reads fail, and the cluster they fail on."""
    async with refusing(request.param, request, kube_assets, tmp_path) as c:
        yield request.param, c


async def test_a_successor_that_cannot_read_the_breaker_keeps_it_open_and_writes_nothing(
    refusal: tuple[str, Cluster], unique_name: Callable[[str], str]
) -> None:
    status, kube = refusal
    release = await kube.release()
    cm_path = f"/api/v1/namespaces/{release.namespace}/configmaps/"
    cm_path += release.config["breaker"]["configmap"]
    role_path = f"{RBAC}/namespaces/{release.namespace}/roles/{release.controller_fullname}"
    nodes = [await kube.node(unique_name(f"gpu-{i}")) for i in range(3)]

    def report(ctl: Controller) -> None:
        for n in nodes:  # the agents stream to the leader: a fault on every node
            connect(ctl.parts.fleet, n)
            ctl.parts.fleet.on_message(n, fault(n, 0))

    one = await kube.controller(SETTINGS, identity="one")
    await until(lambda: one.is_leader or None, "the first leader")
    report(one)
    await kube.settle(one)
    tainted = [n for n in nodes if our_taints(await get_node(kube.api, n)) == TAINTED]
    held = [n for n in nodes if n not in tainted]
    assert len(tainted) == 1 and one.parts.breaker.is_open

    async def stored() -> dict[str, Any] | None:
        try:
            cm = await request(kube.api, "GET", cm_path)
        except NotFoundError:
            return None
        data = cm.get("data") or {}
        return cm if data.get("state") == "open" and tainted[0] in data.get("window", "") else None

    await until(stored, "the open breaker and its window in the ConfigMap")
    role = await request(kube.api, "GET", role_path)
    no_reads = _fresh(role)
    (rule,) = [
        r for r in no_reads["rules"] if "configmaps" in r["resources"] and "get" in r["verbs"]
    ]
    rule["verbs"] = [v for v in rule["verbs"] if v != "get"]
    assert "patch" in rule["verbs"]  # a write would go through
    await request(kube.api, "PUT", role_path, body=no_reads)
    await kube.stop(one, crash=True)  # SIGKILL: the Lease is not given up
    before = await request(kube.api, "GET", cm_path)  # as the first leader left it

    two = await kube.controller(SETTINGS, identity="two")
    report(two)
    try:
        async with TestClient(TestServer(two.web_app())) as http:

            async def unchanged_and_held() -> None:
                """Not ready, nothing written, the held nodes untainted, the taint kept."""
                readyz = await http.get("/readyz")
                assert readyz.status == 503, await readyz.text()
                assert not two.parts.leader_work.ready
                cm = await request(kube.api, "GET", cm_path)
                assert cm["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
                for n in held:
                    assert our_taints(await get_node(kube.api, n)) == []
                assert our_taints(await get_node(kube.api, tainted[0])) == TAINTED

            await until(lambda: two.is_leader or None, "the successor to lead", timeout_s=15)
            for reads in (1, 3, 6):
                await until(
                    lambda n=reads: _load_errors(two, status) >= n, f"reads refused {status}"
                )
                await unchanged_and_held()
            await request(kube.api, "PUT", role_path, body=_fresh(role))  # get is back
            await until(lambda: two.parts.leader_work.ready or None, "the breaker loaded")
            assert (await http.get("/readyz")).status == 200
            assert two.parts.breaker.is_open
            await kube.settle(two)
            for n in held:
                assert our_taints(await get_node(kube.api, n)) == []
            assert our_taints(await get_node(kube.api, tainted[0])) == TAINTED
            data = (await request(kube.api, "GET", cm_path))["data"]
            assert data["state"] == "open" and tainted[0] in data["window"]
    finally:
        with contextlib.suppress(KubeError):
            await request(kube.api, "PUT", role_path, body=_fresh(role))


def _fresh(role: dict[str, Any]) -> dict[str, Any]:
    """The Role as it was, to PUT over its current version (no resourceVersion guard)."""
    body = copy.deepcopy(role)
    body["metadata"].pop("resourceVersion", None)
    return body


async def test_the_largest_window_fits_the_configmap_and_a_larger_one_is_refused(
    api_client: Any, unique_name: Callable[[str], str]
) -> None:
    """MAX_WINDOW entries with 253-character node names and 63-character pools (the largest
    budget the breaker may have) and MAX_OPEN_POOLS open pools are stored and read back whole
    by the real API server; a window larger by 1 % is refused (422: a ConfigMap's data is at
    most 1 MiB)."""
    name = unique_name("breaker-cap")
    store = BreakerStore(api_client, "default", name)
    at = "2026-11-22T10:00:00.123456+00:00"
    node = "n" * (NODE_NAME_MAX - 6)
    pool = "p" * POOL_NAME_MAX
    window = tuple(WindowEntry(f"{i:06d}{node}", at, pool) for i in range(MAX_WINDOW + 35))
    pools = tuple(
        OpenPool(pool=f"{i:03d}{pool[3:]}", tripped_at=at, trips=i + 1)
        for i in range(MAX_OPEN_POOLS)
    )
    state = StoredBreaker(
        open=True, trips=1, tripped_at=at, window=window[:MAX_WINDOW], pools=pools
    )
    try:
        await store.save(state)
        loaded = await store.load()
        assert loaded is not None and loaded.window == state.window
        assert loaded.pools == pools and loaded.open
        too_big = configmap_data(StoredBreaker(open=True, window=window, pools=pools))
        too_big["window"] = json.dumps([{"node": e.node, "at": e.at, "pool": pool} for e in window])
        with pytest.raises(KubeError) as refused:
            await request(
                api_client,
                "PUT",
                f"/api/v1/namespaces/default/configmaps/{name}",
                body={"metadata": {"name": name}, "data": too_big},
            )
        assert refused.value.status == 422 and "1048576" in str(refused.value)
    finally:
        with contextlib.suppress(NotFoundError):
            await request(api_client, "DELETE", f"/api/v1/namespaces/default/configmaps/{name}")
