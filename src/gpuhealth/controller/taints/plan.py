"""Pure diff of a node's desired facts against the node as the API server has it.

The result, :class:`NodePlan`, is one merge patch of the Node (taints, labels, our annotations,
guarded by the resourceVersion), an optional ``GPUHealthy`` condition write, and the
Kubernetes Events (:class:`KubeEvent`) that tell people about it.

Hand-removed taints (docs/operations.md, "Removing a gpuhealth taint by hand"): the node
watch shows a taint of ours gone while the plan still wanted it, and the last writer of the
node's taints was not the controller (:func:`hand_removed`); that is an acknowledgement of that
verdict, recorded as an override incident (``gpuhealth.controller.incidents.overrides``,
state the controller owns: nothing a node's own identity can write decides it). The plan's
input ``acknowledged`` is the node's open overrides: such a taint is not put back while the
verdict (key, value, effect) stays the same; a different verdict, or the node recovering,
ends the override (:attr:`NodePlan.settled`). The annotations earlier versions kept
(``<prefix>/applied-taints``, ``<prefix>/acknowledged-taints``) decide nothing: the first is
dropped with the next write of the node's taints, the second is the operator's and left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.controller.breaker.gate import HardWriteKind
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.kube.node_view import NodeCondition, NodeView
from gpuhealth.controller.names import (
    CONDITION_TYPE,
    EVENT_GPU_RECOVERED,
    EVENT_GPU_UNHEALTHY,
    EVENT_NODE_TAINTED,
    EVENT_NODE_UNTAINTED,
    Keys,
)
from gpuhealth.controller.taints.policy import DesiredNode, Taint


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    taints: list[dict[str, Any]] | None = None
    """The node's complete new taint list, None when unchanged."""
    added: tuple[Taint, ...] = ()
    removed: tuple[Taint, ...] = ()
    blocked: tuple[Taint, ...] = ()
    settled: tuple[Taint, ...] = ()
    """Acknowledged taints whose override ends: the verdict changed or the node recovered."""
    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    condition: NodeCondition | None = None
    events: tuple[KubeEvent, ...] = ()
    """Kubernetes Events to write once the patch is applied."""
    hard_writes: tuple[HardWriteKind, ...] = ()
    """What the plan needs the hard-write gate for (``gpuhealth.controller.breaker.gate``):
    ``node-taint`` when the node has no hard taint of ours and the plan adds one,
    ``node-noexecute`` when it has no NoExecute taint of ours and the plan adds one."""

    @property
    def writes_node(self) -> bool:
        return self.taints is not None or bool(self.labels) or bool(self.annotations)

    @property
    def empty(self) -> bool:
        return not self.writes_node and self.condition is None

    def patch_body(self, resource_version: str) -> dict[str, Any]:
        """A JSON merge patch; the resourceVersion makes it fail with 409 if the node moved."""
        meta: dict[str, Any] = {"resourceVersion": resource_version}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        body: dict[str, Any] = {"metadata": meta}
        if self.taints is not None:
            body["spec"] = {"taints": self.taints}
        return body


NO_EXECUTE = "NoExecute"


def render_taints(taints: Iterable[Taint]) -> str:
    return ",".join(t.render() for t in sorted(taints))


def _taint_of(raw: Mapping[str, Any]) -> Taint:
    return Taint(str(raw.get("key", "")), str(raw.get("value") or ""), str(raw.get("effect", "")))


def ours_on(taints: Iterable[Mapping[str, Any]], keys: Keys) -> frozenset[Taint]:
    """The taints of ours among a node's taints."""
    return frozenset(_taint_of(t) for t in taints if keys.owns(str(t.get("key", ""))))


def kept(desired: DesiredNode, taint: Taint) -> bool:
    """Does the plan keep ``taint`` of ours on the node? Wanted by the policy, or, without
    data (not ``authoritative``), any taint of ours except those the state governs."""
    return taint in desired.taints or (
        not desired.authoritative and taint.key not in desired.governed
    )


def hand_removed(
    old: NodeView,
    new: NodeView,
    desired: DesiredNode,
    keys: Keys,
    *,
    own_manager: str,
    in_flight: frozenset[Taint] = frozenset(),
) -> frozenset[Taint]:
    """The taints of ours someone removed by hand between two views of a node: gone from
    ``new`` while the plan keeps them, not removed by this controller's write in flight
    (``in_flight``: the view its own patch produced comes back through the cache while it is
    set), and the taint list not owned by the controller (``new.taints_by``, the node's
    managedFields: a list the controller wrote last, from any replica, is its own; an emptied
    list has no owner and is judged by the rest)."""
    if new.taints_by == own_manager:
        return frozenset()
    gone = ours_on(old.taints, keys) - ours_on(new.taints, keys) - in_flight
    return frozenset(t for t in gone if kept(desired, t))


def plan_node(
    view: NodeView,
    desired: DesiredNode,
    keys: Keys,
    *,
    acknowledged: frozenset[Taint] = frozenset(),
    refused: frozenset[HardWriteKind] = frozenset(),
) -> NodePlan:
    """``acknowledged``: the node's taints under an open override (removed by hand: not put
    back, not removed either while the node has them). ``refused``: the hard writes the gate
    said no to; the plan leaves those taints out (``node-taint``: every new hard taint,
    ``node-noexecute``: every new NoExecute taint)."""
    ours_raw = {_taint_of(t): t for t in view.taints if keys.owns(str(t.get("key", "")))}
    ours = frozenset(ours_raw)
    target = {t for t in desired.taints if t in ours or t not in acknowledged}
    target |= {t for t in ours if kept(desired, t)}
    settled = tuple(
        sorted(
            t
            for t in acknowledged
            if t not in desired.taints and (desired.authoritative or t.key in desired.governed)
        )
    )

    new_hard = {t for t in target if t.hard and t not in ours}
    new_noexecute = {t for t in new_hard if t.effect == NO_EXECUTE}
    asks: list[HardWriteKind] = []
    if new_hard and not any(t.hard for t in ours):
        asks.append("node-taint")
    if new_noexecute and not any(t.effect == NO_EXECUTE for t in ours):
        asks.append("node-noexecute")
    blocked: set[Taint] = set()
    if "node-taint" in asks and "node-taint" in refused:
        blocked |= new_hard
    if "node-noexecute" in asks and "node-noexecute" in refused:
        blocked |= new_noexecute
    target -= blocked

    added = tuple(sorted(target - ours))
    removed = tuple(sorted(ours - target))
    new_taints: list[dict[str, Any]] | None = None
    if added or removed:
        new_taints = [dict(t) for t in view.taints if not keys.owns(str(t.get("key", "")))]
        new_taints += [dict(ours_raw[t]) for t in sorted(ours & target)]
        new_taints += [t.to_api() for t in added]

    annotations: dict[str, str | None] = {}
    if new_taints is not None and keys.applied_annotation in view.annotations:
        annotations[keys.applied_annotation] = None  # earlier versions' bookkeeping

    labels: dict[str, str | None] = {}
    condition: NodeCondition | None = None
    if desired.manage_meta:
        for key, value in desired.labels:
            if view.labels.get(key) != value:
                labels[key] = value
        if desired.condition is not None and desired.condition != view.condition:
            condition = desired.condition

    return NodePlan(
        node=view.name,
        taints=new_taints,
        added=added,
        removed=removed,
        blocked=tuple(sorted(blocked)),
        settled=settled,
        labels=labels,
        annotations=annotations,
        condition=condition,
        events=_kube_events(view, added, removed, condition),
        hard_writes=tuple(k for k in asks if k not in refused),
    )


def _kube_events(
    view: NodeView,
    added: tuple[Taint, ...],
    removed: tuple[Taint, ...],
    condition: NodeCondition | None,
) -> tuple[KubeEvent, ...]:
    out: list[KubeEvent] = []
    before = view.condition.status if view.condition else None
    if condition is not None and condition.status == "False" and before != "False":
        out.append(KubeEvent("Warning", EVENT_GPU_UNHEALTHY, condition.message))
    if condition is not None and condition.status == "True" and before == "False":
        out.append(KubeEvent("Normal", EVENT_GPU_RECOVERED, condition.message))
    if added:
        out.append(KubeEvent("Warning", EVENT_NODE_TAINTED, "added " + render_taints(added)))
    if removed:
        out.append(KubeEvent("Normal", EVENT_NODE_UNTAINTED, "removed " + render_taints(removed)))
    return tuple(out)


def condition_body(cond: NodeCondition, now_iso: str, transition: bool) -> dict[str, Any]:
    """A strategic merge patch of nodes/status (conditions merge by ``type``)."""
    item: dict[str, Any] = {
        "type": CONDITION_TYPE,
        "status": cond.status,
        "reason": cond.reason,
        "message": cond.message,
        "lastHeartbeatTime": now_iso,
    }
    if transition:
        item["lastTransitionTime"] = now_iso
    return {"status": {"conditions": [item]}}
