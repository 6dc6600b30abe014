"""The reconciler's pure trigger (which node watch changes make it look at a node again), its
plans through the gate, and the Warning about an old override label."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateMetrics, WriteGate
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.metrics import ControllerMetrics
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.taint import quarantine_taint
from gpuhealth.controller.taints.node_api import NodeApi
from gpuhealth.controller.taints.policy import Taint
from gpuhealth.controller.taints.reconciler import Reconciler, ignored_overrides, relevant_change
from gpuhealth.controller.taints.settings import PolicySettings, ReconcilerSettings
from tests.support.clock import FakeClock
from tests.support.fleet import connect
from tests.support.protocol import XID79, recovery
from tests.unit.controller.remediation.test_machine import episode

K = Keys()
BAD = Taint(K.unhealthy_taint, "xid-79", "NoSchedule")
UNHEALTHY_COND = NodeCondition("False", "XidError", "GPU 0")


def view(*taints: Taint, labels: dict[str, str] | None = None) -> NodeView:
    return NodeView(
        name="n1",
        resource_version="42",
        labels=labels or {},
        taints=tuple(t.to_api() for t in taints),
        condition=UNHEALTHY_COND,
        gpus=8,
    )


def test_relevant_change_ignores_heartbeats() -> None:
    a = view(BAD)
    b = dataclasses.replace(a, resource_version="43")
    assert not relevant_change(K, a, b)
    assert relevant_change(K, a, view())
    assert relevant_change(K, a, view(BAD, labels={K.exclude_label: "true"}))
    assert relevant_change(K, a, view(BAD, labels={K.old_exclude_label: "true"}))
    assert relevant_change(K, a, view(BAD, labels={K.old_opt_out_label: "disabled"}))
    assert relevant_change(K, None, a)


@pytest.mark.parametrize(
    ("labels", "named"),
    [
        ({}, []),
        ({K.exclude_label: "true", K.opt_out_label: "disabled"}, []),
        ({"gpuhealth.io/exclude": "true"}, ["node-restriction.kubernetes.io/gpuhealth.io-exclude"]),
        (
            {"gpuhealth.io/remediation": "disabled"},
            ["node-restriction.kubernetes.io/gpuhealth.io-remediation"],
        ),
        (
            {"gpuhealth.io/exclude": "yes", "gpuhealth.io/remediation": "x"},
            [
                "node-restriction.kubernetes.io/gpuhealth.io-exclude",
                "node-restriction.kubernetes.io/gpuhealth.io-remediation",
            ],
        ),
    ],
)
def test_an_old_override_label_is_named_with_its_replacement(
    labels: dict[str, str], named: list[str]
) -> None:
    message = ignored_overrides(K, labels)
    if not named:
        assert message is None
        return
    assert message is not None
    for old, new in zip(sorted(labels), named, strict=True):
        assert f"label {old}={labels[old]} is ignored" in message and f"sets {new} " in message


async def test_an_old_exclude_label_changes_nothing_and_warns_once_per_node() -> None:
    """The node carries ``gpuhealth.io/exclude=true`` (its kubelet may have set it): it is not
    excluded, its taint stays wanted, and one Warning Event names the new label, however
    often the node is reconciled."""
    breaker = CircuitBreaker(BreakerSettings(max_fraction=1.0), FakeClock())
    rec, fleet, cache, _ = reconciler(breaker)
    connect(fleet, "n1", 1, faults={0: XID79})
    node_view = NodeView(
        name="n1",
        resource_version="1",
        gpus=1,
        labels={K.old_exclude_label: "true"},
        taints=(BAD.to_api(),),
        annotations={K.applied_annotation: BAD.render()},
    )
    desired = rec.desired(node_view)
    assert BAD in desired.taints
    # the node as the reconciler wants it (nothing to write): only the Event is queued
    cache.update(
        dataclasses.replace(
            node_view,
            labels={**node_view.labels, **dict(desired.labels)},
            condition=desired.condition,
        )
    )
    for _ in range(3):
        await rec.reconcile("n1")
    node, event = rec._kube_events.get_nowait()
    assert (node, event.type, event.reason) == ("n1", "Warning", "OverrideIgnored")
    assert K.exclude_label in event.message
    assert rec._kube_events.empty()
    excluded = dataclasses.replace(cache.get("n1"), labels={K.exclude_label: "true"})  # type: ignore[arg-type]
    assert BAD not in rec.desired(excluded).taints


def reconciler(
    breaker: CircuitBreaker, *, leading: bool = True
) -> tuple[Reconciler, Fleet, NodeCache, GateMetrics]:
    """A reconciler over real parts that need no API server until they write."""
    fleet = Fleet(clock=FakeClock())
    cache = NodeCache(api=None)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    gate_metrics = GateMetrics(registry)
    gate = WriteGate(
        breaker,
        gpu_nodes=lambda: max(cache.gpu_node_count(), len(fleet)),
        leading=lambda: leading,
        metrics=gate_metrics,
    )
    rec = Reconciler(
        fleet,
        cache,
        NodeApi(None),  # type: ignore[arg-type]
        settings=ReconcilerSettings(),
        policy=PolicySettings(),
        keys=K,
        gate=gate,
        metrics=metrics,
    )
    return rec, fleet, cache, gate_metrics


def test_breaker_trip_blocks_the_plan_and_queues_the_event() -> None:
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=1), FakeClock())
    rec, fleet, cache, metrics = reconciler(breaker)
    for n in ("a", "b"):
        connect(fleet, n, 1, faults={0: XID79})
        cache.update(NodeView(name=n, resource_version="1", gpus=1))
    plan_a, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert plan_a.added and not plan_a.blocked
    plan_b, _ = rec.plan(cache.get("b"))  # type: ignore[arg-type]
    assert plan_b.blocked and not plan_b.added
    assert breaker.is_open
    assert metrics.trips._value.get() == 1
    assert metrics.decisions.labels("node-taint", "blocked")._value.get() == 1
    node, event = rec._kube_events.get_nowait()
    assert (node, event.reason) == ("b", "CircuitBreakerOpen")
    # a recovering node is never blocked
    fleet.on_message("a", recovery("a", 0))
    view = NodeView(name="a", resource_version="2", gpus=1, taints=(BAD.to_api(),))
    plan, _ = rec.plan(view)
    assert plan.removed


def test_a_replica_that_does_not_lead_plans_no_new_hard_taint() -> None:
    breaker = CircuitBreaker(BreakerSettings(max_fraction=1.0), FakeClock())
    rec, fleet, cache, metrics = reconciler(breaker, leading=False)
    connect(fleet, "a", 1, faults={0: XID79})
    cache.update(NodeView(name="a", resource_version="1", gpus=1))
    plan, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert plan.blocked and not plan.added
    assert not breaker.is_open
    assert metrics.decisions.labels("node-taint", "not_leader")._value.get() == 1


def test_a_reset_requeues_every_node() -> None:
    breaker = CircuitBreaker(BreakerSettings(max_fraction=0.0, min_nodes=0), FakeClock())
    rec, _, cache, _ = reconciler(breaker)
    for n in ("a", "b"):
        cache.update(NodeView(name=n, resource_version="1", gpus=1))
    rec.gate.reset(by="test")
    assert len(rec.queue) == 2


@pytest.mark.parametrize(
    ("phase", "held"),
    [
        (Phase.PENDING, False),
        (Phase.QUARANTINED, True),
        (Phase.DRAINING, True),
        (Phase.REMEDIATING, True),
        (Phase.VALIDATING, True),
        (Phase.ESCALATED, True),
        (Phase.RETURNED, False),
    ],
)
def test_an_episode_holds_its_quarantine_taint_until_returned(phase: Phase, held: bool) -> None:
    """The GPUs are healthy again (a reset cleared the fault): the quarantine stays until the
    episode is Returned, and only then is it removed."""
    breaker = CircuitBreaker(BreakerSettings(max_fraction=1.0), FakeClock())
    ep = episode(phase)
    rkeys = Keys(K.prefix)

    def quarantine(node: NodeView) -> Taint | None:
        q = quarantine_taint([ep], node.name, rkeys)
        return None if q is None else Taint(q.key, q.value, q.effect)

    rec, fleet, cache, _ = reconciler(breaker)
    rec.quarantine = quarantine
    connect(fleet, ep.node, 1)
    value = "escalated" if phase is Phase.ESCALATED else "reset-gpu"
    taint = Taint(rkeys.quarantine_taint, value, "NoSchedule")
    cache.update(NodeView(name=ep.node, resource_version="1", gpus=1, taints=(taint.to_api(),)))
    plan, _ = rec.plan(cache.get(ep.node))  # type: ignore[arg-type]
    assert (taint in plan.removed) is not held
    cache.update(NodeView(name=ep.node, resource_version="2", gpus=1))
    plan, _ = rec.plan(cache.get(ep.node))  # type: ignore[arg-type]
    assert (taint in plan.added) is held


class Acks:
    """The reconciler's acknowledgements as the override incidents keep them."""

    def __init__(self) -> None:
        self.acked: dict[str, frozenset[Taint]] = {}
        self.removed: list[tuple[str, frozenset[Taint], str]] = []
        self.ended: list[tuple[str, frozenset[Taint]]] = []

    def of(self, node: str) -> frozenset[Taint]:
        return self.acked.get(node, frozenset())

    def removed_by_hand(self, node: str, taints: frozenset[Taint], by: str) -> None:
        self.removed.append((node, taints, by))
        self.acked[node] = self.of(node) | taints

    def settled(self, node: str, taints: frozenset[Taint], why: str) -> None:
        self.ended.append((node, taints))
        self.acked[node] = self.of(node) - taints


def with_acks(*, detecting: bool = True) -> tuple[Reconciler, Fleet, NodeCache, Acks]:
    rec, fleet, cache, _ = reconciler(
        CircuitBreaker(BreakerSettings(max_fraction=1.0), FakeClock())
    )
    acks = Acks()
    rec.acknowledgements = acks
    rec.detects_overrides = lambda: detecting
    return rec, fleet, cache, acks


def node(rv: str, *taints: Taint, by: str = "", **ann: str) -> NodeView:
    return NodeView(
        name="a",
        resource_version=rv,
        gpus=1,
        taints=tuple(t.to_api() for t in taints),
        taints_by=by,
        annotations=ann,
    )


@pytest.mark.parametrize("detecting", [True, False])
def test_a_hand_removal_in_the_node_watch_is_acknowledged_by_the_leader_only(
    detecting: bool,
) -> None:
    rec, fleet, cache, acks = with_acks(detecting=detecting)
    connect(fleet, "a", 1, faults={0: XID79})
    cache.update(node("1", BAD, by="gpuhealth-controller"))
    cache.update(node("2", by=""))  # kubectl taint ... - : the list emptied, no owner left
    assert acks.removed == ([("a", frozenset({BAD}), "")] if detecting else [])
    plan, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert (BAD in plan.added) is not detecting  # acknowledged: not put back


def test_the_controllers_own_removal_is_not_a_hand_removal() -> None:
    rec, fleet, cache, acks = with_acks()
    connect(fleet, "a", 1, faults={0: XID79})
    cache.update(node("1", BAD))
    rec._removing["a"] = frozenset({BAD})  # its patch in flight comes back through the cache
    cache.update(node("2"))
    rec._removing.clear()
    cache.update(node("3", BAD))
    cache.update(node("4", by="gpuhealth-controller"))  # another replica wrote the list
    assert acks.removed == []


def test_an_override_ends_when_the_node_recovers() -> None:
    rec, fleet, cache, acks = with_acks()
    connect(fleet, "a", 1, faults={0: XID79})
    acks.acked["a"] = frozenset({BAD})
    cache.update(node("1"))
    plan, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert plan.settled == () and not plan.added
    fleet.on_message("a", recovery("a", 0))
    plan, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert plan.settled == (BAD,)


async def test_the_old_annotation_is_named_in_one_warning_per_start() -> None:
    rec, fleet, cache, acks = with_acks()
    connect(fleet, "a", 1, faults={0: XID79})
    forged = {K.acknowledged_annotation: BAD.render(), K.applied_annotation: ""}
    cache.update(node("1", BAD, **forged))
    rec._warn_ignored_overrides(cache.get("a"))  # type: ignore[arg-type]
    rec._warn_ignored_overrides(cache.get("a"))  # type: ignore[arg-type]
    node_name, event = rec._kube_events.get_nowait()
    assert (node_name, event.type, event.reason) == ("a", "Warning", "OverrideIgnored")
    assert "GPUIncident" in event.message and K.acknowledged_annotation in event.message
    assert rec._kube_events.empty()
    plan, _ = rec.plan(cache.get("a"))  # type: ignore[arg-type]
    assert not plan.removed and not plan.settled and acks.removed == []  # the taint stays


@pytest.mark.parametrize(
    ("known", "removed"), [(True, True), (False, False)], ids=["known-closed", "unknown"]
)
def test_a_domain_taint_goes_from_a_node_without_data_only_when_its_incident_is_known(
    known: bool, removed: bool
) -> None:
    """The incident's object may never have reached the API server (its leader died first):
    a successor that knows nothing of the domain keeps the taint until the node reports."""
    rec, _, cache, _ = reconciler(CircuitBreaker(BreakerSettings(max_fraction=1.0), FakeClock()))
    domain = Taint(K.domain_taint, "rack-7", "NoSchedule")
    rec.domain = lambda _node: None  # no open incident for it here
    rec.domain_known = lambda d: known and d == "rack-7"
    cache.update(NodeView(name="t0", resource_version="1", gpus=1, taints=(domain.to_api(),)))
    plan, _ = rec.plan(cache.get("t0"))  # type: ignore[arg-type]
    assert (plan.removed == (domain,)) is removed
