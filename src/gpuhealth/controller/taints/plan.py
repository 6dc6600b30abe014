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
    CORDON_FIELD,
    DISRUPTION_GUARDS,
    EVENT_GPU_RECOVERED,
    EVENT_GPU_UNHEALTHY,
    EVENT_NODE_TAINTED,
    EVENT_NODE_UNTAINTED,
    GUARD_VALUE,
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
    unschedulable: bool | None = None
    """The new ``spec.unschedulable`` (the cordon), None when unchanged."""
    guarded: tuple[str, ...] = ()
    """What gpuhealth sets besides its taints (autoscaler annotations, the cordon)."""
    unguarded: tuple[str, ...] = ()
    """What gpuhealth lifts that it had set."""

    @property
    def writes_node(self) -> bool:
        return (
            self.taints is not None
            or bool(self.labels)
            or bool(self.annotations)
            or self.unschedulable is not None
        )

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
        spec: dict[str, Any] = {}
        if self.taints is not None:
            spec["taints"] = self.taints
        if self.unschedulable is not None:
            spec["unschedulable"] = self.unschedulable
        if spec:
            body["spec"] = spec
        return body


NO_EXECUTE = "NoExecute"


def render_taints(taints: Iterable[Taint]) -> str:
    return ",".join(t.render() for t in sorted(taints))


DECLINED = "!"
"""Marks an entry of ``<prefix>/guards`` someone took back while gpuhealth held the node."""


@dataclass(frozen=True, slots=True)
class Guards:
    """What ``<prefix>/guards`` records: what gpuhealth set (``ours``), and what of it someone
    took back while it held the node (``declined``: an annotation removed or changed, an
    uncordon), which it does not put back until it lets go. Only the names gpuhealth may set
    are kept (:data:`~gpuhealth.controller.names.DISRUPTION_GUARDS`, the cordon)."""

    ours: frozenset[str] = frozenset()
    declined: frozenset[str] = frozenset()

    def render(self) -> str | None:
        items = sorted(self.ours) + sorted(DECLINED + d for d in self.declined)
        return ",".join(items) or None


def parse_guards(value: str | None) -> Guards:
    allowed = {*DISRUPTION_GUARDS, CORDON_FIELD}
    items = [v.strip() for v in (value or "").split(",")]
    declined = {v.removeprefix(DECLINED) for v in items if v.startswith(DECLINED)}
    return Guards(
        ours=frozenset(v for v in items if v in allowed),
        declined=frozenset(declined & allowed),
    )


@dataclass(frozen=True, slots=True)
class GuardPlan:
    """The guards' part of a node plan (pure, :func:`plan_guards`)."""

    annotations: dict[str, str | None]
    """Autoscaler annotations to set or remove, and ``<prefix>/guards``."""
    unschedulable: bool | None
    guarded: tuple[str, ...]
    unguarded: tuple[str, ...]


def _guard(
    name: str, want: bool | None, have: tuple[bool, bool], ours: set[str], declined: set[str]
) -> bool | None:
    """One guard's step: True to set it, False to lift it, None to leave it. ``have``: (it is
    there at all, it is there as gpuhealth sets it). Updates ``ours`` and ``declined``."""
    present, as_ours = have
    if want is None:
        return None  # the episodes are not known yet: as it is
    if not want:
        declined.discard(name)  # let go: what was declined is forgotten
        if name in ours:
            ours.discard(name)
            return False if as_ours else None
        return None
    if name in ours and not as_ours:
        ours.discard(name)  # taken back by someone while held: not fought
        declined.add(name)
        return None
    if name in declined or present:
        return None  # declined, or someone else's (whatever its value): not ours to set
    ours.add(name)
    return True


def plan_guards(
    view: NodeView, desired: DesiredNode, target: Iterable[Taint], keys: Keys
) -> GuardPlan:
    """What gpuhealth sets besides its taints while it holds a node, and lifts when it lets go:
    the autoscalers' annotations (``desired.guard``) and the cordon (``policy.cordon`` over
    the taints it keeps, or ``desired.cordon_always``).

    Only what gpuhealth set is ever lifted, and only as it set it: ``<prefix>/guards`` lists
    it. An annotation or a cordon already there when gpuhealth wanted it is someone else's
    (not listed, never lifted). One of ours someone takes back while gpuhealth holds the node
    (an annotation removed or changed, an uncordon) is declined: not put back, and not lifted,
    until gpuhealth lets go (like a taint removed by hand). The list is on the Node, where
    anyone who can write it (the node's own kubelet included: NodeRestriction guards labels,
    taints and ownerReferences, not annotations or the cordon) can as well remove the
    annotations or uncordon directly: trusting it gives no one a power they lacked. A None
    want leaves everything as it is (the episodes are not known yet)."""
    had = parse_guards(view.annotations.get(keys.guards_annotation))
    ours, declined = set(had.ours), set(had.declined)
    annotations: dict[str, str | None] = {}
    guarded: list[str] = []
    unguarded: list[str] = []
    for key in DISRUPTION_GUARDS:
        value = view.annotations.get(key)
        step = _guard(key, desired.guard, (value is not None, value == GUARD_VALUE), ours, declined)
        if step is not None:
            annotations[key] = GUARD_VALUE if step else None
            (guarded if step else unguarded).append(key)
    cordoning = [
        t
        for t in target
        if (desired.cordon == "quarantine" and t.key == keys.quarantine_taint)
        or (desired.cordon == "hard-taint" and t.hard)
    ]
    want_cordon: bool | None = True if cordoning else desired.cordon_always
    have = (view.unschedulable, view.unschedulable)
    cordon = _guard(CORDON_FIELD, want_cordon, have, ours, declined)
    if cordon is not None:
        (guarded if cordon else unguarded).append(CORDON_FIELD)
    record = Guards(frozenset(ours), frozenset(declined)).render()
    if record != view.annotations.get(keys.guards_annotation):
        annotations[keys.guards_annotation] = record
    return GuardPlan(annotations, cordon, tuple(guarded), tuple(unguarded))


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

    guards = plan_guards(view, desired, target, keys)
    annotations: dict[str, str | None] = dict(guards.annotations)
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
        unschedulable=guards.unschedulable,
        guarded=guards.guarded,
        unguarded=guards.unguarded,
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
