"""What gpuhealth sets besides its taints while it holds a node (the autoscalers' annotations, the
cordon) and lifts when it lets go: only what it set (``<prefix>/guards``), as it set it
(``plan_guards``, pure, table-driven); then through ``desired_node`` and ``plan_node``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuhealth.controller.fleet.health import NodeHealth
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import (
    CORDON_FIELD,
    KARPENTER_DO_NOT_DISRUPT,
    SCALE_DOWN_DISABLED,
    Keys,
)
from gpuhealth.controller.taints.plan import Guards, parse_guards, plan_guards, plan_node
from gpuhealth.controller.taints.policy import (
    KEEP,
    DesiredNode,
    Hold,
    Taint,
    desired_node,
)
from gpuhealth.controller.taints.settings import CordonMode, PolicySettings

K = Keys()
KDD, CAS = KARPENTER_DO_NOT_DISRUPT, SCALE_DOWN_DISABLED
BOTH = f"{CAS},{KDD}"
QUARANTINE = Taint(K.quarantine_taint, "reset-gpu", "NoSchedule")
UNHEALTHY = Taint(K.unhealthy_taint, "xid-79", "NoSchedule")
DEGRADED = Taint(K.degraded_taint, "thermal", "PreferNoSchedule")


@dataclass(frozen=True)
class Case:
    name: str
    guard: bool | None
    annotations: dict[str, str] = field(default_factory=dict)
    """On the Node (``<prefix>/guards`` as ``guards``)."""
    guards: str | None = None
    unschedulable: bool = False
    cordon: CordonMode = "never"
    cordon_always: bool | None = False
    target: tuple[Taint, ...] = ()
    want_annotations: dict[str, str | None] = field(default_factory=dict)
    want_guards: str | None = "unchanged"
    want_unschedulable: bool | None = None


CASES = [
    Case(
        "held: both annotations set and recorded",
        guard=True,
        want_annotations={KDD: "true", CAS: "true"},
        want_guards=BOTH,
    ),
    Case(
        "held, already ours: nothing to write",
        guard=True,
        annotations={KDD: "true", CAS: "true"},
        guards=BOTH,
    ),
    Case(
        "held, someone else's do-not-disrupt: left alone, not ours",
        guard=True,
        annotations={KDD: "true"},
        want_annotations={CAS: "true"},
        want_guards=CAS,
    ),
    Case(
        "let go: only what gpuhealth set is lifted",
        guard=False,
        annotations={KDD: "true", CAS: "true"},
        guards=CAS,
        want_annotations={CAS: None},
        want_guards=None,
    ),
    Case(
        "let go: one of ours changed by someone: theirs now, not lifted",
        guard=False,
        annotations={KDD: "false", CAS: "true"},
        guards=BOTH,
        want_annotations={CAS: None},
        want_guards=None,
    ),
    Case(
        "held, one of ours removed by someone: declined, not put back",
        guard=True,
        annotations={CAS: "true"},
        guards=BOTH,
        want_guards=f"{CAS},!{KDD}",
    ),
    Case(
        "held, declined stays declined: nothing to write",
        guard=True,
        annotations={CAS: "true"},
        guards=f"{CAS},!{KDD}",
    ),
    Case(
        "held, someone else's value (false) is theirs: not overwritten",
        guard=True,
        annotations={KDD: "false"},
        want_annotations={CAS: "true"},
        want_guards=CAS,
    ),
    Case(
        "let go: what was declined is forgotten",
        guard=False,
        guards=f"!{KDD}",
        want_guards=None,
    ),
    Case(
        "held, our cordon lifted by someone: declined, not cordoned again",
        guard=False,
        cordon="quarantine",
        target=(QUARANTINE,),
        guards=CORDON_FIELD,
        want_guards=f"!{CORDON_FIELD}",
    ),
    Case(
        "episodes not known yet: what gpuhealth set stays",
        guard=None,
        annotations={KDD: "true", CAS: "true"},
        guards=BOTH,
        unschedulable=True,
        cordon_always=None,
    ),
    Case(
        "not held, nothing of ours: nothing to write",
        guard=False,
        annotations={KDD: "true"},
    ),
    Case(
        "a forged record names only what gpuhealth may set",
        guard=False,
        annotations={"example.com/x": "true"},
        guards="example.com/x",
        want_guards=None,
    ),
    Case(
        "cordon: quarantine, while the quarantine taint is kept",
        guard=False,
        cordon="quarantine",
        target=(QUARANTINE,),
        want_guards=CORDON_FIELD,
        want_unschedulable=True,
    ),
    Case(
        "cordon: quarantine, an unhealthy taint does not cordon",
        guard=False,
        cordon="quarantine",
        target=(UNHEALTHY,),
    ),
    Case(
        "cordon: hard-taint, any hard taint of ours cordons",
        guard=False,
        cordon="hard-taint",
        target=(UNHEALTHY,),
        want_guards=CORDON_FIELD,
        want_unschedulable=True,
    ),
    Case(
        "cordon: hard-taint, a PreferNoSchedule taint does not",
        guard=False,
        cordon="hard-taint",
        target=(DEGRADED,),
    ),
    Case(
        "someone else's cordon: never lifted, not recorded",
        guard=False,
        unschedulable=True,
        cordon="hard-taint",
        target=(UNHEALTHY,),
    ),
    Case(
        "our cordon, the taint gone: lifted",
        guard=False,
        unschedulable=True,
        guards=CORDON_FIELD,
        cordon="hard-taint",
        want_guards=None,
        want_unschedulable=False,
    ),
    Case(
        "our cordon lifted by someone: theirs, not put back (the taint is gone)",
        guard=False,
        guards=CORDON_FIELD,
        cordon="never",
        want_guards=None,
    ),
    Case(
        "cordoned for the replacement's drain, whatever policy.cordon says",
        guard=False,
        cordon="never",
        cordon_always=True,
        want_guards=CORDON_FIELD,
        want_unschedulable=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_only_what_gpuhealth_set_is_lifted(case: Case) -> None:
    annotations = dict(case.annotations)
    if case.guards is not None:
        annotations[K.guards_annotation] = case.guards
    view = NodeView(
        name="n", resource_version="1", annotations=annotations, unschedulable=case.unschedulable
    )
    desired = DesiredNode(
        taints=frozenset(case.target),
        authoritative=True,
        manage_meta=True,
        guard=case.guard,
        cordon=case.cordon,
        cordon_always=case.cordon_always,
    )
    plan = plan_guards(view, desired, case.target, K)
    record = plan.annotations.pop(K.guards_annotation, "unchanged")
    assert plan.annotations == case.want_annotations
    assert record == case.want_guards
    assert plan.unschedulable == case.want_unschedulable


def test_the_record_keeps_only_names_gpuhealth_may_set() -> None:
    got = parse_guards(f"{KDD}, spec.unschedulable,evil/x,!{CAS},!evil/y")
    assert (got.ours, got.declined) == ({KDD, CORDON_FIELD}, {CAS})
    assert got.render() == f"{KDD},{CORDON_FIELD},!{CAS}"
    assert parse_guards(None) == Guards() and Guards().render() is None


REPORTING = NodeHealth(name="n", reporting="ok", gpus=())


@pytest.mark.parametrize(
    ("hold", "guard_on", "excluded", "guard", "cordon_always"),
    [
        (Hold(QUARANTINE), True, False, True, False),
        (Hold(QUARANTINE), False, False, False, False),  # policy.disruption_guard off
        (Hold(QUARANTINE, guard=False), True, False, False, False),  # a managed repairer's
        (Hold(None, guard=False, cordon=True), True, False, False, True),
        (KEEP, True, False, None, None),
        (Hold(QUARANTINE), True, True, False, False),  # excluded: the operator's node
        (None, True, False, False, False),
    ],
)
def test_the_hold_becomes_the_desired_guard(
    hold: Hold | None,
    guard_on: bool,
    excluded: bool,
    guard: bool | None,
    cordon_always: bool | None,
) -> None:
    settings = PolicySettings(disruption_guard=guard_on, cordon="quarantine")
    d = desired_node(REPORTING, settings, K, excluded=excluded, hold=hold)
    assert (d.guard, d.cordon_always, d.cordon) == (guard, cordon_always, "quarantine")
    if hold is not None and hold.taint is not None and not excluded:
        assert hold.taint in d.taints


def test_the_node_plan_writes_guards_and_cordon_in_one_guarded_patch() -> None:
    view = NodeView(name="n", resource_version="7")
    d = desired_node(REPORTING, PolicySettings(cordon="quarantine"), K, hold=Hold(QUARANTINE))
    plan = plan_node(view, d, K)
    body = plan.patch_body(view.resource_version)
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["metadata"]["annotations"][KDD] == "true"
    assert body["metadata"]["annotations"][CAS] == "true"
    assert set(body["metadata"]["annotations"][K.guards_annotation].split(",")) == {
        KDD,
        CAS,
        CORDON_FIELD,
    }
    assert body["spec"]["unschedulable"] is True
    assert QUARANTINE.to_api() in body["spec"]["taints"]
    assert set(plan.guarded) == {KDD, CAS, CORDON_FIELD}
    # the node as written: the next plan is empty
    written = NodeView(
        name="n",
        resource_version="8",
        taints=tuple(body["spec"]["taints"]),
        annotations={k: v for k, v in body["metadata"]["annotations"].items() if v is not None},
        unschedulable=True,
        labels=dict(body["metadata"].get("labels") or {}),
    )
    again = plan_node(written, d, K)
    assert not again.writes_node, again
    # the episode returns: everything of ours goes, in one patch
    released = desired_node(REPORTING, PolicySettings(cordon="quarantine"), K)
    gone = plan_node(written, released, K)
    meta = gone.patch_body("8")["metadata"]["annotations"]
    assert meta[KDD] is None and meta[CAS] is None and meta[K.guards_annotation] is None
    assert gone.unschedulable is False and QUARANTINE in gone.removed
