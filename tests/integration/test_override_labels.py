"""The operator's overrides on a Node live where its own kubelet cannot write them, against the
real kube-apiserver with the Node authorizer and NodeRestriction on (issue 38, item 5).

- A node's own identity (``system:node:<name>``, the ``node_api_client`` fixture) is refused
  the exclude and remediation opt-out labels under ``node-restriction.kubernetes.io/`` (403).
- The node setting the old labels (``gpuhealth.io/exclude``, ``gpuhealth.io/remediation``) on
  itself is accepted by the API server but changes nothing: its hard taint stays through the
  controller's passes, and a Warning Event ``OverrideIgnored`` names the label to use, once.
- An admin setting the new exclude label excludes the node as before: gpuhealth's taint goes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpuhealth.controller.kube.rest import MERGE_PATCH, PermanentKubeError, request
from localkube import ControlPlane
from tests.integration.controller_helpers import (
    EXCLUDE,
    OPT_OUT,
    PREFIX,
    UNHEALTHY,
    Cluster,
    cluster,
    get_node,
    our_taints,
)
from tests.support.protocol import XID79, hello, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

OLD_EXCLUDE = f"{PREFIX}/exclude"
OLD_OPT_OUT = f"{PREFIX}/remediation"
TAINTED = [(UNHEALTHY, "xid-79", "NoSchedule")]


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def _label(api: Any, node: str, labels: dict[str, str | None]) -> dict[str, Any]:
    body = {"metadata": {"labels": labels}}
    return await request(api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)


async def _warnings(kube: Cluster, node: str) -> list[dict[str, Any]]:
    data = await request(
        kube.api,
        "GET",
        "/api/v1/namespaces/default/events",
        query=[("fieldSelector", f"involvedObject.name={node},reason=OverrideIgnored")],
    )
    return [e for e in data.get("items") or [] if e["type"] == "Warning"]


async def test_nothing_the_node_writes_lifts_its_taint_and_the_operators_label_does(
    kube: Cluster,
    node_api_client: Callable[[str], Awaitable[Any]],
    unique_name: Callable[[str], str],
) -> None:
    name = await kube.node(unique_name("gpu-own"), kwok=False)
    ctl = await kube.controller()
    ctl.parts.fleet.on_connect(name, hello(name))
    ctl.parts.fleet.on_message(name, snapshot(name, faults={0: XID79}))

    async def tainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, name)) == TAINTED else None

    await until(tainted, "the hard taint")
    await kube.settle(ctl)
    node = await node_api_client(name)

    # The new labels: NodeRestriction refuses them to the node itself.
    for label, value in ((EXCLUDE, "true"), (OPT_OUT, "disabled")):
        with pytest.raises(PermanentKubeError) as refused:
            await _label(node, name, {label: value})
        assert refused.value.status == 403 and label in str(refused.value)

    # The old ones it may set, and the controller ignores them: the taint stays.
    await _label(node, name, {OLD_EXCLUDE: "true", OLD_OPT_OUT: "disabled"})
    labels = (await get_node(kube.api, name))["metadata"]["labels"]
    assert labels[OLD_EXCLUDE] == "true" and EXCLUDE not in labels

    async def warned() -> list[dict[str, Any]] | None:
        return await _warnings(kube, name) or None

    (event,) = await until(warned, "a Warning Event OverrideIgnored on the node")
    assert EXCLUDE in event["message"] and OPT_OUT in event["message"]
    assert event["source"]["component"] == "gpuhealth-controller"
    ctl.parts.reconciler.enqueue(name)  # another pass: no second Event, the taint kept
    await kube.settle(ctl)
    assert our_taints(await get_node(kube.api, name)) == TAINTED
    assert len(await _warnings(kube, name)) == 1

    # The operator's label, set by an admin, excludes the node as before.
    await _label(kube.api, name, {EXCLUDE: "true"})

    async def untainted() -> bool | None:
        return True if our_taints(await get_node(kube.api, name)) == [] else None

    await until(untainted, "the taint removed once an operator excluded the node")
