"""The pure diff: desired facts versus the node; foreign taints, acknowledgements, breaker."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.breaker.gate import HardWriteKind
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.plan import parse_taints, plan_node, render_taints
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
    applied: set[Taint] | None = None,
    acked: set[Taint] | None = None,
    labels: dict[str, str] | None = None,
    condition: NodeCondition | None = None,
) -> NodeView:
    ann = {}
    if applied:
        ann[K.applied_annotation] = render_taints(applied)
    if acked:
        ann[K.acknowledged_annotation] = render_taints(acked)
    raw = tuple(t.to_api() if isinstance(t, Taint) else t for t in taints)
    return NodeView(
        name="n1",
        resource_version="42",
        labels=labels or {},
        annotations=ann,
        taints=raw,
        condition=condition,
        gpus=8,
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


def test_add_taint_keeps_foreign_verbatim_and_records_applied() -> None:
    p = plan_node(view(FOREIGN, FOREIGN_NE), desired(BAD), K)
    assert p.added == (BAD,) and not p.removed
    assert p.taints == [FOREIGN, FOREIGN_NE, BAD.to_api()]
    body = p.patch_body("42")
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["annotations"] == {K.applied_annotation: BAD.render()}
    assert body["metadata"]["labels"] == {K.state_label: "unhealthy"}
    assert p.condition == UNHEALTHY_COND
    assert p.hard_writes == ("node-taint",)
    assert [e.reason for e in p.events] == ["GPUUnhealthy", "NodeTainted"]


def test_steady_state_is_empty() -> None:
    v = view(
        FOREIGN,
        BAD,
        applied={BAD},
        labels={K.state_label: "unhealthy"},
        condition=UNHEALTHY_COND,
    )
    p = plan_node(v, desired(BAD), K)
    assert p.empty and not p.events


def test_recovery_removes_only_ours() -> None:
    v = view(FOREIGN, BAD, SOFT, applied={BAD, SOFT}, condition=UNHEALTHY_COND)
    p = plan_node(v, desired(state="healthy", condition=HEALTHY_COND), K)
    assert p.taints == [FOREIGN]
    assert set(p.removed) == {BAD, SOFT}
    assert p.annotations == {K.applied_annotation: None}
    assert [e.reason for e in p.events] == ["GPURecovered", "NodeUntainted"]


def test_value_change_replaces_taint() -> None:
    p = plan_node(view(BAD, applied={BAD}), desired(BAD2), K)
    assert p.added == (BAD2,) and p.removed == (BAD,)
    assert p.hard_writes == ()


def test_not_authoritative_never_removes() -> None:
    p = plan_node(view(BAD, applied={BAD}), desired(authoritative=False, condition=None), K)
    assert p.empty


def test_not_authoritative_still_adds() -> None:
    p = plan_node(view(FOREIGN), desired(BAD, authoritative=False, condition=None), K)
    assert p.added == (BAD,)


def test_hand_removed_taint_is_acknowledged_not_readded() -> None:
    p = plan_node(view(FOREIGN, applied={BAD}), desired(BAD, condition=None), K)
    assert not p.added and p.taints is None
    assert p.acknowledged == (BAD,)
    assert p.annotations == {
        K.applied_annotation: None,
        K.acknowledged_annotation: BAD.render(),
    }
    assert [e.reason for e in p.events] == ["TaintAcknowledged"]
    # next pass (annotations written): steady
    v2 = view(FOREIGN, acked={BAD})
    assert plan_node(v2, desired(BAD, condition=None), K).empty


def test_acknowledgement_cleared_by_new_verdict() -> None:
    p = plan_node(view(acked={BAD}), desired(BAD2, condition=None), K)
    assert p.added == (BAD2,)
    assert p.annotations == {
        K.applied_annotation: BAD2.render(),
        K.acknowledged_annotation: None,
    }


def test_acknowledgement_cleared_by_recovery() -> None:
    p = plan_node(view(acked={BAD}), desired(condition=None), K)
    assert p.annotations == {K.acknowledged_annotation: None}


def test_hand_removal_while_no_data_is_remembered() -> None:
    p = plan_node(view(applied={BAD}), desired(authoritative=False, condition=None), K)
    assert p.acknowledged == (BAD,) and not p.added


def test_breaker_blocks_new_hard_taint_but_not_meta() -> None:
    p = plan_node(view(FOREIGN), desired(BAD, SOFT), K, refused=NO_TAINT)
    assert p.blocked == (BAD,)
    assert p.added == (SOFT,)
    assert p.labels == {K.state_label: "unhealthy"}
    assert p.hard_writes == ()


def test_breaker_does_not_block_an_already_tainted_node() -> None:
    p = plan_node(view(BAD, applied={BAD}), desired(BAD2), K, refused=NO_TAINT)
    assert p.added == (BAD2,) and not p.blocked


def test_breaker_never_blocks_removal() -> None:
    p = plan_node(view(BAD, applied={BAD}), desired(state="healthy"), K, refused=NO_TAINT)
    assert p.removed == (BAD,)


@pytest.mark.parametrize(
    ("text", "taints"),
    [
        ("", set()),
        ("gpuhealth.io/unhealthy=xid-79:NoSchedule", {BAD}),
        (render_taints({BAD, SOFT}), {BAD, SOFT}),
        ("junk,,=:,a=b", set()),
        ("k=:NoSchedule", {Taint("k", "", "NoSchedule")}),
    ],
)
def test_annotation_round_trip(text: str, taints: set[Taint]) -> None:
    assert parse_taints(text) == taints


KEY = st.from_regex(
    r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?/[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True
)


VALUE = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?", fullmatch=True)


EFFECT = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])


@given(st.sets(st.builds(Taint, KEY, VALUE, EFFECT), max_size=6))
def test_taint_annotation_round_trips(taints: set[Taint]) -> None:
    assert parse_taints(render_taints(taints)) == taints


@given(st.text(max_size=300))
def test_taint_annotation_never_crashes(text: str) -> None:
    for t in parse_taints(text):
        assert t.key and t.effect


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
    p = plan_node(view(*have, applied=set(have)), desired(*want), K)
    assert p.hard_writes == asks


def test_a_refused_noexecute_leaves_the_noschedule_taint_in_the_plan() -> None:
    p = plan_node(view(), desired(BAD, NOEXEC), K, refused=NO_NOEXEC)
    assert p.added == (BAD,) and p.blocked == (NOEXEC,)
    assert p.hard_writes == ("node-taint",)


def test_noexecute_on_a_cordoned_node_is_blocked_when_refused() -> None:
    p = plan_node(view(BAD, applied={BAD}), desired(BAD, NOEXEC), K, refused=NO_NOEXEC)
    assert p.blocked == (NOEXEC,) and not p.added and p.taints is None
