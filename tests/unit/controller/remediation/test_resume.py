"""A controller killed at every phase resumes from the GPURemediation status alone.

The first runner drives an episode to a phase and is dropped together with everything it
held in memory (the agents' reports too); a new runner, built from nothing but the stored
objects and the world, finishes the episode. Nothing may happen twice: no order id is
executed twice, no pod is evicted twice, a node reboots once.
"""

from __future__ import annotations

import pytest

from gpuhealth.controller.remediation.action_reports import ReportBook
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.protocol import Allocation
from tests.fakes.remediation_world import World, fault_condition, gpu_uuid, node_facts, pod
from tests.support.remediation import drive, finished, only, phase_is, runner_for, settings

PHASES = [
    Phase.PENDING,
    Phase.QUARANTINED,
    Phase.DRAINING,
    Phase.REMEDIATING,
    Phase.VALIDATING,
    Phase.RETURNED,
]


def world_for(action: str) -> World:
    w = World()
    if action == "reset":
        cond = fault_condition("xid-48", "RESET_GPU")
        alloc = Allocation(
            namespace="work",
            pod="train-0",
            container="main",
            gpu_uuid=gpu_uuid(5),
            device_id=gpu_uuid(5),
        )
        w.nodes["node-a"] = node_facts(unhealthy={5: cond}, allocations=(alloc,))
    else:
        w.nodes["node-a"] = node_facts(unhealthy={5: fault_condition("xid-79", "RESTART_BM")})
    w.add(pod("train-0"), pod("other", gpus=0))
    return w


@pytest.mark.parametrize("action", ["reset", "reboot"])
@pytest.mark.parametrize("kill_at", PHASES, ids=[p.value for p in PHASES])
async def test_killed_controller_resumes_from_status(action: str, kill_at: Phase) -> None:
    w = world_for(action)
    cfg = settings()
    first = runner_for(w, cfg)
    if kill_at is Phase.PENDING:
        await first.consider("node-a")
    else:
        await drive(w, first, phase_is(w, kill_at))
    assert only(w).phase is kill_at
    # the controller dies: its memory (the report book, the work queue) is gone
    w.book = ReportBook()
    second = runner_for(w, cfg)
    await drive(w, second, finished(w))
    ep = only(w)
    assert all(n == 1 for n in w.executed.values()), w.executed
    assert len(w.evicted) == len(set(w.evicted))
    expected = ["train-0"] if action == "reset" else ["other", "train-0"]
    assert sorted(w.evicted) == expected
    if action == "reboot":
        assert w.nodes["node-a"].boot_id == "boot-1+1"
    assert [n for _, n in w.notes].count("RemediationStarted") == 1
    assert ep.status.times.returned is not None


async def test_a_stale_cache_cannot_start_a_second_episode_for_one_fault() -> None:
    """A replica whose cache has not seen the first episode yet (a leader change right after
    it was created) derives the same name: the create finds it and nothing new starts."""
    w = world_for("reset")
    a = runner_for(w, settings())
    first = await a.consider("node-a")
    stale = runner_for(w, settings())
    real = w.store.episodes
    w.store.episodes = lambda: []  # type: ignore[method-assign]
    try:
        second = await stale.consider("node-a")
    finally:
        w.store.episodes = real  # type: ignore[method-assign]
    assert first == second and len(w.store.episodes()) == 1
