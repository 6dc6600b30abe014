"""Stage durations, outcomes and the episode gauges, from a whole episode in the world; the
invalid objects the episode watch skipped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.assembly import build_episodes
from gpuhealth.controller.remediation.metrics import RemediationCollector
from gpuhealth.controller.remediation.model import Phase
from tests.fakes.remediation_world import World, fault_condition, node_facts, pod
from tests.support.clock import FakeClock
from tests.support.remediation import drive, finished, phase_is, runner_for, settings


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_a_returned_episode_observes_every_stage_once() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(
        unhealthy={1: fault_condition("xid-48", "RESET_GPU")}, allocations=None
    )
    w.add(pod("p"))
    reg = CollectorRegistry()
    r = runner_for(w, settings(), registry=reg)
    await drive(w, r, finished(w))
    for stage in ("quarantine", "drain", "remediate", "validate", "return", "total"):
        assert (
            value(
                reg,
                "gpuhealth_remediation_stage_duration_seconds_count",
                stage=stage,
                action="reset-gpu",
            )
            == 1
        ), stage
    total = value(
        reg, "gpuhealth_remediation_stage_duration_seconds_sum", stage="total", action="reset-gpu"
    )
    assert total > 0
    assert (
        value(
            reg,
            "gpuhealth_remediation_outcomes_total",
            outcome="returned",
            action="reset-gpu",
            reason="Validated",
        )
        == 1
    )
    assert value(reg, "gpuhealth_remediation_started_total", action="reset-gpu") == 1
    assert value(reg, "gpuhealth_remediation_evictions_total", result="evicted") == 1
    assert (
        value(reg, "gpuhealth_remediation_orders_total", action="reset-gpu", result="delivered")
        == 1
    )


async def test_gauges_count_phases_and_age_unfinished_episodes() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(
        unhealthy={1: fault_condition("row-remap-failure", "CONTACT_SUPPORT")}
    )
    reg = CollectorRegistry()
    r = runner_for(w, settings(), registry=reg)
    await drive(w, r, phase_is(w, Phase.ESCALATED))
    assert (
        value(
            reg,
            "gpuhealth_remediation_outcomes_total",
            outcome="escalated",
            action="escalate",
            reason="ContactSupport",
        )
        == 1
    )
    coll = CollectorRegistry()
    coll.register(RemediationCollector(w.store.episodes, w.clock.now))
    w.advance(100)
    assert value(coll, "gpuhealth_remediation_episodes_by_phase", phase="Escalated") == 1
    assert value(coll, "gpuhealth_remediation_episodes_by_phase", phase="Pending") == 0
    age = value(
        coll,
        "gpuhealth_remediation_phase_age_seconds",
        node="node-a",
        phase="Escalated",
        action="escalate",
        reason="ContactSupport",
    )
    assert age >= 100


def test_an_invalid_gpuremediation_is_skipped_and_counted_in_the_metrics() -> None:
    """The episode watch skips an object that is no valid GPURemediation (here: no spec) and
    the controller's registry exports the count (``build_episodes``, as composed)."""
    reg = CollectorRegistry()
    episodes = build_episodes(
        None,  # type: ignore[arg-type]  # no API call: the watch's pages are handed in
        Keys(),
        WatchSettings(),
        timeout_s=1.0,
        registry=reg,
        clock=FakeClock(),
    )
    bogus = {"metadata": {"name": "by-hand", "resourceVersion": "1"}, "spec": {"nodeName": 7}}
    seen: set[str] = set()
    episodes.store.cache.listed([bogus], seen)  # the watch cache, as its informer feeds it
    episodes.store.cache.list_complete(seen)
    assert episodes.store.episodes() == [] and seen == set()
    assert value(reg, "gpuhealth_remediation_invalid_objects_total") == 1
    episodes.store.cache.apply("MODIFIED", bogus)
    assert value(reg, "gpuhealth_remediation_invalid_objects_total") == 2
