"""The pure diff: desired facts versus the node; foreign taints, acknowledgements (the override
incidents, never the node's annotations), the hand-removal rule, breaker."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.breaker.gate import HardWriteKind
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.plan import hand_removed, plan_node, render_taints
from gpuhealth.controller.taints.policy import DesiredNode, Taint

K = Keys()
BAD = Taint(K.unhealthy_taint, "xid-79", "NoSchedule")
BAD2 = Taint(K.unhealthy_taint, "ecc-dbe", "NoSchedule")
SOFT = Taint(K.degraded_taint, "thermal", "PreferNoSchedule")
FOREIGN = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
FOREIGN_NE = {"key": "example.com/x", "value": "y", "effect": "NoExecute", "timeAdded": "t"}
UNHEALTHY_COND = NodeCondition("False", "XidError", "GPU 0")
HEALTHY_COND = NodeCondition("True", "AllGPUsHealthy", "8 GPUs healthy")
NO_TAINT: frozenset[HardWriteKind] = frozenset({"node-taint"})
NO_NOEXEC: frozenset[HardWriteKind] = frozenset({"node-noexecute"})


def view(
    *taints: Taint | dict[str, Any],
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    condition: NodeCondition | None = None,
    taints_by: str = "",
) -> NodeView:
    raw = tuple(t.to_api() if isinstance(t, Taint) else t for t in taints)
    return NodeView(
        name="n1",
        resource_version="42",
        labels=labels or {},
        annotations=annotations or {},
        taints=raw,
        condition=condition,
        gpus=8,
        taints_by=taints_by,
    )


def desired(
    *taints: Taint,
    authoritative: bool = True,
    state: str = "unhealthy",
    condition: NodeCondition | None = UNHEALTHY_COND,
) -> DesiredNode:
    return DesiredNode(
        taints=frozenset(taints),
        authoritative=authoritative,
        manage_meta=condition is not None,
        labels=((K.state_label, state),) if condition is not None else (),
        condition=condition,
        state=state,
    )


def test_add_taint_keeps_foreign_verbatim() -> None:
    p = plan_node(view(FOREIGN, FOREIGN_NE), desired(BAD), K)
    assert p.added == (BAD,) and not p.removed
    assert p.taints == [FOREIGN, FOREIGN_NE, BAD.to_api()]
    body = p.patch_body("42")
    assert body["metadata"]["resourceVersion"] == "42"
    assert "annotations" not in body["metadata"]  # nothing bookkept on the node any more
    assert body["metadata"]["labels"] == {K.state_label: "unhealthy"}
    assert p.condition == UNHEALTHY_COND
    assert p.hard_writes == ("node-taint",)
    assert [e.reason for e in p.events] == ["GPUUnhealthy", "NodeTainted"]


def test_steady_state_is_empty() -> None:
    v = view(FOREIGN, BAD, labels={K.state_label: "unhealthy"}, condition=UNHEALTHY_COND)
    p = plan_node(v, desired(BAD), K)
    assert p.empty and not p.events


def test_recovery_removes_only_ours_and_the_old_bookkeeping_with_it() -> None:
    old = {K.applied_annotation: render_taints({BAD, SOFT}), K.acknowledged_annotation: "x"}
    v = view(FOREIGN, BAD, SOFT, annotations=old, condition=UNHEALTHY_COND)
    p = plan_node(v, desired(state="healthy", condition=HEALTHY_COND), K)
    assert p.taints == [FOREIGN]
    assert set(p.removed) == {BAD, SOFT}
    # earlier versions' applied-taints goes with a write of the taints; the operator's
    # acknowledged-taints is left (ignored, named in a Warning Event by the reconciler)
    assert p.annotations == {K.applied_annotation: None}
    assert [e.reason for e in p.events] == ["GPURecovered", "NodeUntainted"]


def test_the_old_bookkeeping_alone_is_no_reason_to_write() -> None:
    v = view(
        BAD,
        annotations={K.applied_annotation: BAD.render()},
        labels={K.state_label: "unhealthy"},
        condition=UNHEALTHY_COND,
    )
    p = plan_node(v, desired(BAD), K)
    assert p.empty


def test_value_change_replaces_taint() -> None:
    p = plan_node(view(BAD), desired(BAD2), K)
    assert p.added == (BAD2,) and p.removed == (BAD,)
    assert p.hard_writes == ()


def test_not_authoritative_never_removes() -> None:
    p = plan_node(view(BAD), desired(authoritative=False, condition=None), K)
    assert p.empty


def test_not_authoritative_still_adds() -> None:
    p = plan_node(view(FOREIGN), desired(BAD, authoritative=False, condition=None), K)
    assert p.added == (BAD,)


DOMAIN = Taint(K.domain_taint, "rack-1", "NoSchedule")
GOVERNED = frozenset({K.domain_taint})


def no_data(*taints: Taint) -> DesiredNode:
    return DesiredNode(frozenset(taints), False, False, governed=GOVERNED)


@pytest.mark.parametrize(
    ("name", "have", "want", "acked", "added", "removed", "settled"),
    [
        ("acknowledged: not put back", (FOREIGN,), desired(BAD), {BAD}, (), (), ()),
        ("acknowledged but there: not removed", (BAD,), desired(BAD), {BAD}, (), (), ()),
        ("a new verdict is not acknowledged", (), desired(BAD2), {BAD}, (BAD2,), (), (BAD,)),
        ("recovered: the override ends", (), desired(state="healthy"), {BAD}, (), (), (BAD,)),
        ("no data: it stays acknowledged", (), no_data(), {BAD}, (), (), ()),
        ("no data: not put back either", (), no_data(BAD), {BAD}, (), (), ()),
        ("a domain taint acknowledged", (), no_data(DOMAIN), {DOMAIN}, (), (), ()),
        ("the domain closed: it ends", (), no_data(), {DOMAIN}, (), (), (DOMAIN,)),
        ("nothing acknowledged: put back", (), desired(BAD), set(), (BAD,), (), ()),
    ],
)
def test_acknowledged_taints(
    name: str,
    have: tuple[Taint | dict[str, Any], ...],
    want: DesiredNode,
    acked: set[Taint],
    added: tuple[Taint, ...],
    removed: tuple[Taint, ...],
    settled: tuple[Taint, ...],
) -> None:
    p = plan_node(view(*have), want, K, acknowledged=frozenset(acked))
    assert (p.added, p.removed, p.settled) == (added, removed, settled), name


def test_forged_annotations_change_nothing() -> None:
    """What a node's own identity can write on its Node decides nothing: its taint stays."""
    forged = {
        K.acknowledged_annotation: BAD.render(),
        K.applied_annotation: render_taints({BAD, SOFT}),
    }
    p = plan_node(view(BAD, annotations=forged), desired(BAD, condition=None), K)
    assert p.empty
    gone = plan_node(view(annotations=forged), desired(BAD, condition=None), K)
    assert gone.added == (BAD,)


OWN = "gpuhealth-controller"


@pytest.mark.parametrize(
    ("name", "old", "new", "want", "by", "in_flight", "found"),
    [
        ("removed by hand", (BAD, SOFT), (SOFT,), desired(BAD, SOFT), "kubectl", (), {BAD}),
        ("our own write (managedFields)", (BAD,), (), desired(BAD), OWN, (), set()),
        ("our own write in flight", (BAD,), (), desired(BAD), "kubectl", (BAD,), set()),
        ("not wanted any more", (BAD,), (), desired(state="healthy"), "kubectl", (), set()),
        ("no data: every taint of ours is kept", (BAD,), (), no_data(), "kubectl", (), {BAD}),
        ("no data: the domain taint is governed", (DOMAIN,), (), no_data(), "k", (), set()),
        ("the domain taint while open", (DOMAIN,), (), no_data(DOMAIN), "k", (), {DOMAIN}),
        ("a foreign taint is not ours", (FOREIGN, BAD), (BAD,), desired(BAD), "k", (), set()),
        ("another value replaced it", (BAD,), (BAD2,), desired(BAD), "kubectl", (), {BAD}),
        ("unknown manager", (BAD,), (), desired(BAD), "", (), {BAD}),
    ],
)  # fmt: skip
def test_the_hand_removal_rule(
    name: str,
    old: tuple[Taint | dict[str, Any], ...],
    new: tuple[Taint | dict[str, Any], ...],
    want: DesiredNode,
    by: str,
    in_flight: tuple[Taint, ...],
    found: set[Taint],
) -> None:
    got = hand_removed(
        view(*old),
        view(*new, taints_by=by),
        want,
        K,
        own_manager=OWN,
        in_flight=frozenset(in_flight),
    )
    assert got == found, name


def test_breaker_blocks_new_hard_taint_but_not_meta() -> None:
    p = plan_node(view(FOREIGN), desired(BAD, SOFT), K, refused=NO_TAINT)
    assert p.blocked == (BAD,)
    assert p.added == (SOFT,)
    assert p.labels == {K.state_label: "unhealthy"}
    assert p.hard_writes == ()


def test_breaker_does_not_block_an_already_tainted_node() -> None:
    p = plan_node(view(BAD), desired(BAD2), K, refused=NO_TAINT)
    assert p.added == (BAD2,) and not p.blocked


def test_breaker_never_blocks_removal() -> None:
    p = plan_node(view(BAD), desired(state="healthy"), K, refused=NO_TAINT)
    assert p.removed == (BAD,)


NOEXEC = Taint(K.unhealthy_taint, "xid-79", "NoExecute")


@pytest.mark.parametrize(
    ("have", "want", "asks"),
    [
        ((), (BAD,), ("node-taint",)),
        ((), (BAD, NOEXEC), ("node-taint", "node-noexecute")),
        ((BAD,), (BAD, NOEXEC), ("node-noexecute",)),
        ((BAD, NOEXEC), (BAD, NOEXEC), ()),
        ((SOFT,), (SOFT, BAD), ("node-taint",)),
        ((), (SOFT,), ()),
    ],
    ids=["first-hard", "first+noexecute", "noexecute-cordoned", "steady", "soft-to-hard", "soft"],
)
def test_the_plan_asks_the_gate_for_each_kind_of_new_hard_taint(
    have: tuple[Taint, ...], want: tuple[Taint, ...], asks: tuple[str, ...]
) -> None:
    p = plan_node(view(*have), desired(*want), K)
    assert p.hard_writes == asks


def test_a_refused_noexecute_leaves_the_noschedule_taint_in_the_plan() -> None:
    p = plan_node(view(), desired(BAD, NOEXEC), K, refused=NO_NOEXEC)
    assert p.added == (BAD,) and p.blocked == (NOEXEC,)
    assert p.hard_writes == ("node-taint",)


def test_noexecute_on_a_cordoned_node_is_blocked_when_refused() -> None:
    p = plan_node(view(BAD), desired(BAD, NOEXEC), K, refused=NO_NOEXEC)
    assert p.blocked == (NOEXEC,) and not p.added and p.taints is None
