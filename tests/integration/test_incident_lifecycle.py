"""On-call's lifecycle of the incidents against the real kube-apiserver (issue 38, items 1
and 5): the GPUIncident CRD, the chart's admission policy and RBAC, the
``gpuhealth-controller incident`` command as a real process with an on-call user's kubeconfig,
and the controller applying what on-call did (with the chart's identity and RBAC).

- Who acts is verified, not claimed: a user with the chart's ``<fullname>-controller-oncall``
  ClusterRole cannot write an action with another user's name, nor touch an incident's labels
  or status, nor read a Node; the controller's ServiceAccount writes the status.
- ack and silence stop the incident from paging (its metric series); resolve closes an NVLink
  domain incident and lifts its taint from every node; a fault first seen before the resolution
  does not open it again, a new one does.
- A taint of ours removed by hand (an operator, admin identity) is an override incident: not
  put back, also after a controller restart; resolving the override puts it back.
- Nothing a node's own identity writes on its Node (the old acknowledged-taints annotation, a
  forged applied-taints) lifts its taint; a Warning Event names the new mechanism.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.client import make_api_client, who_am_i
from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, KubeError, request
from localkube import ControlPlane
from tests.integration.controller_helpers import (
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    our_taints,
)
from tests.support.fleet import connect
from tests.support.protocol import XID79, fabric_fault, hello, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

DOMAIN_TAINT = f"{PREFIX}/nvlink-domain"
CLUSTER = "9b0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60.0


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def cli(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """``gpuhealth-controller incident ARGS`` as a real process; (exit, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuhealth.controller.cli",
        "incident",
        *args,
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def oncall(kube: Cluster, name: str) -> tuple[Path, str, ApiClient]:
    """A ServiceAccount bound to the release's on-call ClusterRole: its kubeconfig, its user
    name and a client (closed with the cluster)."""
    release = await kube.release()
    path = await release.cluster_user(kube.cp, kube.api, name, "oncall")
    api = await make_api_client(str(path))
    kube.clients.append(api)
    return path, f"system:serviceaccount:{release.namespace}:{name}", api


async def status_of(kube: Cluster, kind: str) -> list[dict[str, Any]]:
    data = await request(kube.api, "GET", INCIDENTS)
    return [o for o in data.get("items") or [] if (o.get("status") or {}).get("kind") == kind]


async def refused(call: Awaitable[Any]) -> int:
    """``call`` fails with an HTTP error; its status."""
    try:
        await call
    except KubeError as exc:
        return exc.status
    raise AssertionError("the API server accepted it")


def action(by: str, reason: str, **extra: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {"by": by, "at": now, "reason": reason, **extra}


def patch_lifecycle(api: ApiClient, name: str, **actions: dict[str, Any]) -> Awaitable[Any]:
    return request(
        api,
        "PATCH",
        f"{INCIDENTS}/{name}",
        body={"spec": {"lifecycle": actions}},
        content_type=MERGE_PATCH,
    )


def series(ctl: Controller, incident: str) -> list[str]:
    """The ``gpuhealth_incident`` lines of one incident."""
    text = generate_latest(ctl.parts.registry).decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("gpuhealth_incident{") and incident in line
    ]


async def domain_taints(kube: Cluster, nodes: list[str]) -> list[bool]:
    out = []
    for name in nodes:
        n = await get_node(kube.api, name)
        out.append(any(t["key"] == DOMAIN_TAINT for t in n["spec"].get("taints") or []))
    return out


async def domain_incident(
    kube: Cluster, unique_name: Callable[[str], str]
) -> tuple[Controller, list[str], list[str], str]:
    """A controller and an NVLink domain of 4 trays, 2 of them faulty: the incident open and
    written, every tray tainted. (controller, rack, faulty, the incident's id)"""
    domain = f"{CLUSTER}.{unique_name('c')[-6:].replace('-', '')}"
    label = {"nvidia.com/gpu.clique": domain}
    rack = [await kube.node(unique_name(f"tray{i}"), kwok=True, labels=label) for i in range(4)]
    ctl = await kube.controller({"breaker": {"enabled": False}, "domains": {"window_s": 60.0}})
    for name in rack:
        connect(ctl.parts.fleet, name)
    now = datetime.now(UTC)
    for name in rack[1:3]:
        ctl.parts.fleet.on_message(name, snapshot(name, 2, faults={0: fabric_fault(now)}))

    async def tainted() -> bool | None:
        return True if all(await domain_taints(kube, rack)) else None

    await until(tainted, "every tray tainted", timeout_s=30)

    async def written() -> str | None:
        objs = await status_of(kube, "domain")
        return str(objs[0]["metadata"]["name"]) if objs else None

    return ctl, rack, rack[1:3], await until(written, "the GPUIncident written")


async def test_who_acts_on_an_incident_is_verified_by_the_api_server(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    _ctl, rack, _faulty, iid = await domain_incident(kube, unique_name)
    _path, me, api = await oncall(kube, "oncall-a")

    # The admission policy takes effect a moment after it is created: a forged `by` is
    # refused from then on (each attempt a new action: an unchanged one is not checked).
    attempts = 0

    async def forged_refused() -> int | None:
        nonlocal attempts
        attempts += 1
        try:
            await patch_lifecycle(api, iid, acknowledged=action("mallory", f"try {attempts}"))
        except KubeError as exc:
            return exc.status
        return None

    assert await until(forged_refused, "the forged ack refused", timeout_s=20) == 403
    obj = await patch_lifecycle(api, iid, acknowledged=action(me, "looking at it"))
    assert obj["spec"]["lifecycle"]["acknowledged"]["by"] == me
    # the admin acknowledges in its own name; on-call silences while that stays as it is
    admin = await who_am_i(kube.api, timeout_s=10)
    obj = await patch_lifecycle(kube.api, iid, acknowledged=action(admin, "mine now"))
    assert obj["spec"]["lifecycle"]["acknowledged"]["by"] == admin
    until_t = "2099-01-01T00:00:00Z"
    obj = await patch_lifecycle(api, iid, silenced=action(me, "rack swap", until=until_t))
    assert obj["spec"]["lifecycle"]["silenced"]["by"] == me
    assert obj["spec"]["lifecycle"]["acknowledged"]["by"] == admin
    # changing the admin's action in the admin's name is forging it
    forged = patch_lifecycle(api, iid, acknowledged=action(admin, "changed"))
    assert await refused(forged) == 403
    assert await refused(patch_lifecycle(api, iid, resolved=action("root", "x"))) == 403

    # labels are the controller's; status is the controller's (RBAC); no Node permission
    labels = {"metadata": {"labels": {f"{PREFIX}/incident-kind": "job"}}}
    assert (
        await refused(
            request(api, "PATCH", f"{INCIDENTS}/{iid}", body=labels, content_type=MERGE_PATCH)
        )
        == 403
    )
    status_patch = {"status": {"state": "closed"}}
    assert (
        await refused(
            request(
                api,
                "PATCH",
                f"{INCIDENTS}/{iid}/status",
                body=status_patch,
                content_type=MERGE_PATCH,
            )
        )
        == 403
    )
    assert await refused(request(api, "GET", f"/api/v1/nodes/{rack[0]}")) == 403
    assert await refused(request(api, "DELETE", f"{INCIDENTS}/{iid}")) == 403
    # the controller's ServiceAccount writes the status (what its mirror does all along)
    release = await kube.release()
    ctl_api = await make_api_client(str(release.kubeconfig))
    kube.clients.append(ctl_api)
    current = await request(ctl_api, "GET", f"{INCIDENTS}/{iid}")
    body = {
        "apiVersion": current["apiVersion"],
        "kind": current["kind"],
        "metadata": {
            "name": iid,
            "resourceVersion": current["metadata"]["resourceVersion"],
        },
        "status": current["status"],
    }
    await request(ctl_api, "PUT", f"{INCIDENTS}/{iid}/status", body=body)
    kept = await request(kube.api, "GET", f"{INCIDENTS}/{iid}")
    assert kept["metadata"]["labels"][f"{PREFIX}/incident-kind"] == "domain"
    assert kept["spec"]["lifecycle"]["acknowledged"]["by"] == admin


async def test_on_call_acks_silences_and_resolves_with_the_command(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ctl, rack, faulty, iid = await domain_incident(kube, unique_name)
    path, me, _api = await oncall(kube, "oncall-b")
    assert any('lifecycle="paging"' in line for line in series(ctl, iid))

    code, out, err = await cli(path, "list")
    assert code == 0, err
    assert iid in out and "paging" in out

    code, out, err = await cli(path, "ack", iid, "--reason", "on it")
    assert (code, out.strip()) == (0, f"incident {iid} acknowledged by {me}"), err
    assert ctl.parts.incidents is not None
    book = ctl.parts.incidents.book
    await until(
        lambda: any('lifecycle="acknowledged"' in line for line in series(ctl, iid)),
        "the incident stops paging (acknowledged)",
    )
    incident = book.get(iid)
    assert incident is not None and incident.open and incident.lifecycle.acknowledged is not None
    assert incident.lifecycle.acknowledged.by == me

    code, _out, err = await cli(path, "silence", iid, "--reason", "rack swap", "--until", "2h")
    assert code == 0, err
    await until(
        lambda: any('lifecycle="silenced"' in line for line in series(ctl, iid)),
        "the incident silenced",
    )

    async def observed() -> dict[str, Any] | None:
        obj = await request(kube.api, "GET", f"{INCIDENTS}/{iid}")
        seen = obj["status"].get("observedLifecycle") or {}
        return obj if {"acknowledged", "silenced"} <= set(seen) else None

    obj = await until(observed, "the controller's observation written")
    assert obj["status"]["observedLifecycle"]["silenced"]["applied"] is True
    code, out, err = await cli(path, "list")
    assert code == 0 and "silenced by" in out and me in out, err

    # usage and refusals
    assert (await cli(path, "ack", iid))[0] == 2  # no --reason
    assert (await cli(path, "silence", iid, "--reason", "x"))[0] == 2  # no --until
    assert (await cli(path, "resolve", "domain-000000000000", "--reason", "x"))[0] == 1

    # resolve: closed, the domain taint lifted from every tray
    code, _out, err = await cli(path, "resolve", iid, "--reason", "fabric manager restarted")
    assert code == 0, err

    async def lifted() -> bool | None:
        return True if not any(await domain_taints(kube, rack)) else None

    await until(lifted, "the domain taint lifted by the resolve", timeout_s=30)
    closed = book.get(iid)
    assert closed is not None and not closed.open
    assert closed.close_reason == f"resolved by {me}: fabric manager restarted"

    async def stored_closed() -> bool | None:
        obj = await request(kube.api, "GET", f"{INCIDENTS}/{iid}")
        return True if obj["status"]["state"] == "closed" else None

    await until(stored_closed, "the GPUIncident closed")
    # the faults the agents still report are older than the resolution: no new incident
    for name in faulty:
        ctl.parts.fleet.on_message(
            name, snapshot(name, 2, faults={0: fabric_fault(datetime(2020, 1, 1, tzinfo=UTC))})
        )
    await kube.settle(ctl)
    assert book.list(kind="domain") == [] and not any(await domain_taints(kube, rack))
    # a new fault opens it again (a new occurrence: on-call's old actions do not apply)
    now = datetime.now(UTC)
    for name in faulty:
        ctl.parts.fleet.on_message(name, snapshot(name, 2, faults={0: fabric_fault(now)}))
    await until(lambda: book.list(kind="domain"), "the domain incident open again")
    (again,) = book.list(kind="domain")
    assert again.id == iid and again.paging(datetime.now(UTC)) == "paging"

    async def tainted_again() -> bool | None:
        return True if all(await domain_taints(kube, rack)) else None

    await until(tainted_again, "every tray tainted again", timeout_s=30)


async def test_a_taint_removed_by_hand_is_an_override_that_survives_a_restart(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    node = await kube.node(unique_name("hand"))
    ctl = await kube.controller({"breaker": {"enabled": False}})
    ctl.parts.fleet.on_connect(node, hello(node))
    ctl.parts.fleet.on_message(node, snapshot(node, faults={0: XID79}))

    async def tainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, node)) else None

    await until(tainted, "the node tainted")
    await kube.settle(ctl)
    # an operator removes it with kubectl taint (admin identity, kubectl's field manager)
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{node}",
        query=[("fieldManager", "kubectl-taint")],
        body={"spec": {"taints": []}},
        content_type=MERGE_PATCH,
    )
    assert ctl.parts.incidents is not None
    book = ctl.parts.incidents.book
    (override,) = await until(lambda: book.list(kind="override"), "an override incident")
    assert override.override is not None
    assert override.override.taint.render() == f"{UNHEALTHY}=xid-79:NoSchedule"
    assert override.subjects.nodes == (node,)
    await kube.settle(ctl)
    assert our_taints(await get_node(kube.api, node)) == []  # not put back

    async def written() -> bool | None:
        objs = await status_of(kube, "override")
        return True if objs and objs[0]["status"]["state"] == "open" else None

    await until(written, "the override's GPUIncident written")
    await kube.stop(ctl)
    second = await kube.controller({"breaker": {"enabled": False}})
    await until(lambda: second.parts.leader_work.ready, "the new controller prepared")
    second.parts.fleet.on_connect(node, hello(node))
    second.parts.fleet.on_message(node, snapshot(node, faults={0: XID79}))
    await kube.settle(second)
    assert our_taints(await get_node(kube.api, node)) == []  # still acknowledged
    assert second.parts.incidents is not None
    assert [i.id for i in second.parts.incidents.book.list(kind="override")] == [override.id]

    path, _me, _api = await oncall(kube, "oncall-c")
    code, _out, err = await cli(path, "resolve", override.id, "--reason", "put it back")
    assert code == 0, err

    async def back() -> list[tuple[str, str, str]] | None:
        return our_taints(await get_node(kube.api, node)) or None

    assert await until(back, "the taint put back") == [(UNHEALTHY, "xid-79", "NoSchedule")]


async def test_nothing_the_node_writes_on_its_node_lifts_its_taint(
    kube: Cluster,
    unique_name: Callable[[str], str],
    node_api_client: Callable[[str], Awaitable[Any]],
) -> None:
    node = await kube.node(unique_name("own"))
    ctl = await kube.controller({"breaker": {"enabled": False}})
    ctl.parts.fleet.on_connect(node, hello(node))
    ctl.parts.fleet.on_message(node, snapshot(node, faults={0: XID79}))
    want = [(UNHEALTHY, "xid-79", "NoSchedule")]

    async def tainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, node)) == want else None

    await until(tainted, "the node tainted")
    await kube.settle(ctl)
    kubelet = await node_api_client(node)
    forged = {
        f"{PREFIX}/acknowledged-taints": f"{UNHEALTHY}=xid-79:NoSchedule",
        f"{PREFIX}/applied-taints": f"{UNHEALTHY}=xid-79:NoSchedule,{UNHEALTHY}=x:NoExecute",
    }
    await request(
        kubelet,
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"metadata": {"annotations": forged}},
        content_type=MERGE_PATCH,
    )
    await kube.settle(ctl)
    n = await get_node(kube.api, node)
    assert our_taints(n) == want
    assert n["metadata"]["annotations"][f"{PREFIX}/acknowledged-taints"]  # written, ignored
    assert ctl.parts.incidents is not None
    assert ctl.parts.incidents.book.list(kind="override") == []

    async def warned() -> list[dict[str, Any]] | None:
        data = await request(
            kube.api,
            "GET",
            "/api/v1/namespaces/default/events",
            query=[("fieldSelector", f"involvedObject.name={node}")],
        )
        hits = [e for e in data.get("items") or [] if e.get("reason") == "OverrideIgnored"]
        return hits or None

    (event,) = await until(warned, "a Warning Event naming the new mechanism")
    assert event["type"] == "Warning" and "GPUIncident" in event["message"]
