"""A node in an open NVLink domain incident starts no remediation episode (one decision, the
operator's, for a shared fabric); the same node outside an incident does."""

from __future__ import annotations

from tests.fakes.remediation_world import World, fault_condition, node_facts
from tests.support.remediation import runner_for, settings


async def test_a_node_of_an_open_domain_incident_starts_no_episode() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(unhealthy={5: fault_condition("xid-149", "RESET_GPU")})
    runner = runner_for(w, settings())
    runner.held = lambda node: "NVLink domain d1" if node == "node-a" else None
    assert await runner.consider("node-a") is None
    runner.held = lambda _node: None
    assert await runner.consider("node-a") is not None
