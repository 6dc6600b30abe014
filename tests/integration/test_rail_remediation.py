"""A rail's verdict and the remediation loop against the real API server (issue 42): the
GPURemediation CRD and store, the node watch, the Nodes' taints; the agents stand in as in
``test_remediation_kube.py`` (``tests/integration/remediation_helpers.py``), except that
after the reset the GPU still carries its rail's verdict: the link still flaps.

- A node whose GPUs are unhealthy only by their rail (the operator made ``rail-flapping``
  hard, and mapped ``CHECK_NETWORK`` to a reboot): no GPURemediation, no order, no quarantine.
- A node with the same hard rail and, later, an XID 48 on a GPU behind it: one episode, a GPU
  reset (never the reboot the rail's action would map to), and the node returned although
  the rail still flaps."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta

import msgspec
import pytest
from kubernetes_asyncio import client

from gpuhealth.controller.kube.rest import KubeError, request
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.orders import ORDER_KINDS
from gpuhealth.protocol.remediation import Order, ResetGpuOrder
from localkube.kwok import Kwok
from localkube.objects import create_gpu_node, create_namespace
from tests.integration.remediation_helpers import (
    KEYS,
    Agent,
    Harness,
    alloc,
    install_crd,
    quick,
    running,
    xid48,
)
from tests.support.protocol import RAIL_FLAPPING, T0, transition

pytestmark = pytest.mark.integration

HARD_RAIL = msgspec.structs.replace(
    RAIL_FLAPPING, severity="unhealthy", since=T0 - timedelta(hours=1)
)
"""``rdma.rails.flapping_severity: unhealthy``, an hour before the XID."""


@dataclass
class FlappingAgent(Agent):
    """Resets like the stand-in agent, but the GPU keeps its rail's verdict afterwards."""

    kinds: list[str] = field(default_factory=list)

    async def send(self, node: str, req: Order) -> bool:
        self.kinds.append(ORDER_KINDS[type(req)])
        done = await super().send(node, req)
        if isinstance(req, ResetGpuOrder):
            for uuid in req.gpus:
                index = int(uuid.rsplit("-", 1)[1])
                self.fleet.on_message(node, transition(node, index, "unhealthy", HARD_RAIL))
        return done


@pytest.fixture
async def namespace(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> AsyncIterator[str]:
    ns = unique_name("rail")
    await create_namespace(api_client, ns)
    yield ns
    with contextlib.suppress(KubeError):
        await request(api_client, "DELETE", f"/api/v1/namespaces/{ns}")


async def test_a_rail_never_starts_or_widens_a_remediation_and_never_blocks_one(
    api_client: client.ApiClient, kwok: Kwok, namespace: str, unique_name: Callable[[str], str]
) -> None:
    await install_crd(api_client)
    link_only, both = unique_name("rail-only"), unique_name("rail-xid")
    for node in (link_only, both):
        await create_gpu_node(api_client, node)
    settings = quick(action_map={"RESET_GPU": "reset-gpu", "CHECK_NETWORK": "reboot"})
    h = Harness(api_client, settings)
    agent = FlappingAgent(h.fleet, h.book)
    h.agent = h.runner.p.orders = agent
    behind = {2: HARD_RAIL, 3: HARD_RAIL}
    h.agent_connects(link_only, faults=behind, allocations=[])
    async with running(h):
        for _ in range(5):
            await h.round([link_only])
        assert [e for e in h.store.episodes() if e.node == link_only] == []

        h.agent_connects(
            both,
            faults={2: HARD_RAIL, 3: HARD_RAIL},
            allocations=[alloc(namespace, "trainer", both, 3)],
        )
        h.fleet.on_message(both, transition(both, 3, "unhealthy", HARD_RAIL, xid48()))
        await h.drive(
            [both],
            lambda: h.episode_of(both).phase is Phase.RETURNED,
            "the XID's episode returned the node while its rail still flaps",
        )
        for _ in range(3):
            await h.round([link_only, both])
    ep = h.episode_of(both)
    assert ep.spec.action == "reset-gpu" and ep.spec.scope == "gpu"
    assert [(g.index, g.code) for g in ep.spec.fault.gpus] == [(3, "xid-48")]
    assert h.fleet.node_health(both).gpus[3].conditions == (HARD_RAIL,)  # the link still flaps
    assert [e for e in h.store.episodes() if e.node == link_only] == []
    assert agent.kinds == ["reset-gpu", "validate"]  # never a reboot
    for node in (link_only, both):
        obj = await request(api_client, "GET", f"/api/v1/nodes/{node}")
        taints = obj["spec"].get("taints") or []
        assert not any(t["key"] == KEYS.quarantine_taint for t in taints), (node, taints)
