"""Drain planning (pure): which pods to evict now, which to wait for, and when it is done.

Evictions go through the Eviction API only, so PodDisruptionBudgets are honoured: a 429
means wait and try again, never delete. Never evicted: DaemonSet pods, static (mirror)
pods, gpuhealth's own pods (a protected label on a pod its release's Deployment or DaemonSet
controls, in its namespace: the label alone, which any tenant can set, protects nothing),
finished pods.

Targets: for a ``node`` scope every other pod on the node; for a ``gpu`` scope (a GPU
reset) only the pods holding a failed GPU according to the agent's PodResources
attribution (when the agent cannot attribute, every pod that requests GPUs). Each target
brings its gang (:mod:`gang`), also from other nodes; a gang is evicted in one round, and
not at all while a PodDisruptionBudget would refuse some of its members (evicting part of
a gang is the waste gang-awareness exists to avoid).

Blast radius: a gang's membership is frozen (by pod UID, kept in the episode's status) the
round it is first evicted, and a pod created after the drain began is never a member, so
the replacements a JobSet or Job controller starts on healthy nodes are never evicted. The
whole drain is counted before anything is evicted: more than ``max_pods`` pods, more than
``max_other_nodes`` other nodes, or a gang over ``gang.max_pods``, and nothing is evicted
(``over_cap`` says why; never a partial gang). Pods already listed as waiting stay targets
until they are gone.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuhealth.controller.remediation.facts import NodeFacts, PdbFacts, PodFacts
from gpuhealth.controller.remediation.gang import Gang, gang_of, members
from gpuhealth.controller.remediation.model import FrozenGang, GangKey, PodRecord, Spec
from gpuhealth.controller.remediation.settings import DrainRule, DrainSettings

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def exempt_reason(pod: PodFacts, settings: DrainSettings) -> str | None:
    """Why the drain never touches this pod, or None."""
    kinds = {kind for kind, _ in pod.owners}
    if "DaemonSet" in kinds:
        return "daemonset"
    if MIRROR_ANNOTATION in pod.annotations or "Node" in kinds:
        return "static"
    if pod.release_owned and any(
        pod.labels.get(k) == v for k, v in settings.protected_labels.items()
    ):
        return "protected"
    if pod.finished:
        return "finished"
    return None


def rule_for(namespace: str, settings: DrainSettings) -> DrainRule:
    for rule in settings.rules:
        if any(fnmatch.fnmatchcase(namespace, pat) for pat in rule.namespaces):
            return rule
    return DrainRule(
        namespaces=("*",),
        mode=settings.default_mode,
        wait_s=settings.default_wait_s,
        grace_period_s=settings.grace_period_s,
    )


def selects(pdb: PdbFacts, pod: PodFacts) -> bool:
    """Does the PDB's label selector select the pod (matchLabels AND matchExpressions)?"""
    if pdb.namespace != pod.namespace:
        return False
    if pdb.selects_all:
        return True
    if not pdb.match_labels and not pdb.match_expressions:
        return False  # a null selector selects nothing
    if any(pod.labels.get(k) != v for k, v in pdb.match_labels.items()):
        return False
    for req in pdb.match_expressions:
        have = req.key in pod.labels
        value = pod.labels.get(req.key)
        ok = {
            "In": have and value in req.values,
            "NotIn": not have or value not in req.values,
            "Exists": have,
            "DoesNotExist": not have,
        }.get(req.operator, False)
        if not ok:
            return False
    return True


def gang_blocked(gang_pods: Sequence[PodFacts], pdbs: Iterable[PdbFacts]) -> PdbFacts | None:
    """The first PDB that would refuse part of the gang, or None."""
    live = [p for p in gang_pods if p.deletion_timestamp is None]
    for pdb in pdbs:
        covered = sum(1 for p in live if selects(pdb, p))
        if covered and (not pdb.up_to_date or pdb.disruptions_allowed < covered):
            return pdb
    return None


@dataclass(frozen=True, slots=True)
class Eviction:
    pod: PodFacts
    grace_period_s: int | None
    gang: str = ""


@dataclass(frozen=True, slots=True)
class DrainPlan:
    evict: tuple[Eviction, ...] = ()
    force: tuple[PodFacts, ...] = ()
    """Evicted, stuck terminating, and the namespace rule allows a forced delete."""
    waiting: tuple[PodRecord, ...] = ()
    targets: int = 0
    next_change: datetime | None = None
    """When a ``wait`` pod's time runs out (re-plan then)."""
    gangs: tuple[str, ...] = field(default=())
    freeze: tuple[FrozenGang, ...] = ()
    """Gangs evicted for the first time in this plan, with their members' UIDs."""
    over_cap: str = ""
    """Why nothing is evicted: the drain would pass a blast-radius cap (held whole)."""

    @property
    def done(self) -> bool:
        return self.targets == 0


def _direct_targets(
    spec: Spec, node: NodeFacts, pods: Sequence[PodFacts], settings: DrainSettings
) -> list[PodFacts]:
    local = [p for p in pods if exempt_reason(p, settings) is None]
    if spec.scope == "node":
        return local
    failed = {g.uuid for g in spec.fault.gpus}
    allocations = node.allocations
    if allocations is None or (not allocations and any(p.gpu_request > 0 for p in local)):
        # no PodResources view: every pod that holds GPUs may be using the failed one
        return [p for p in local if p.gpu_request > 0]
    holders = {(a.namespace, a.pod) for a in allocations if a.gpu_uuid in failed}
    return [p for p in local if p.key in holders]


def frozen_gang(g: FrozenGang) -> Gang:
    return Gang(g.namespace, g.kind, tuple((k.source, k.key, k.value) for k in g.match))


def _freeze(gang: Gang, group: Sequence[PodFacts], now: datetime) -> FrozenGang:
    """The members being evicted (at most ``max_pods``: the caps were checked); members
    already terminating are someone else's business and not kept."""
    return FrozenGang(
        kind=gang.kind,
        namespace=gang.namespace,
        match=[GangKey(source=src, key=k, value=v) for src, k, v in gang.match],
        uids=sorted(p.uid for p in group if p.deletion_timestamp is None),
        at=now,
    )


def gangs_in_scope(
    spec: Spec,
    node: NodeFacts,
    pods: Sequence[PodFacts],
    settings: DrainSettings,
    frozen: Sequence[FrozenGang] = (),
) -> list[Gang]:
    """The gangs of the pods the drain targets directly and the gangs it already evicted
    (their members are fetched next)."""
    found = {frozen_gang(g) for g in frozen}
    if settings.gang.enabled:
        for p in _direct_targets(spec, node, pods, settings):
            gang = gang_of(p, settings.gang.kinds)
            if gang is not None:
                found.add(gang)
    return sorted(found)


def _cap(
    spec: Spec,
    targets: Mapping[str, tuple[PodFacts, str]],
    too_large: set[str],
    *,
    touched: Sequence[str],
    evicted_count: int,
    settings: DrainSettings,
    off_limits: Mapping[str, str],
) -> str:
    """Why the drain would pass a blast-radius cap ("" when it does not)."""
    for pod, gang in targets.values():
        why = off_limits.get(pod.node) if pod.deletion_timestamp is None else None
        if why is not None and pod.node != spec.node_name:
            return f"gang {gang} has a member on node {pod.node}, which is labelled {why}"
    if too_large:
        limit = settings.gang.max_pods
        return f"gang {min(too_large)} has more than {limit} pods (drain.gang.max_pods)"
    live = [p for p, _ in targets.values() if p.deletion_timestamp is None]
    pods = evicted_count + len(live)
    if pods > settings.max_pods:
        return f"the drain would evict {pods} pods, more than drain.max_pods ({settings.max_pods})"
    others = set(touched) | {p.node for p in live if p.node and p.node != spec.node_name}
    if len(others) > settings.max_other_nodes:
        return (
            f"the drain would evict pods on {len(others)} other nodes, more than "
            f"drain.max_other_nodes ({settings.max_other_nodes})"
        )
    return ""


def plan_drain(
    spec: Spec,
    node: NodeFacts,
    *,
    pods: Sequence[PodFacts],
    gang_pods: Sequence[PodFacts],
    pdbs: Sequence[PdbFacts],
    previous_waiting: Sequence[PodRecord],
    settings: DrainSettings,
    started: datetime,
    now: datetime,
    frozen: Sequence[FrozenGang] = (),
    touched: Sequence[str] = (),
    evicted_count: int = 0,
    off_limits: Mapping[str, str] | None = None,
) -> DrainPlan:
    """``off_limits``: other nodes an operator keeps the loop off (a gang member there holds
    the drain)."""
    everywhere: dict[str, PodFacts] = {}
    for p in (*pods, *gang_pods):
        everywhere.setdefault(p.uid or f"{p.namespace}/{p.name}", p)
    fixed = {frozen_gang(g).name: frozenset(g.uids) for g in frozen}
    targets: dict[str, tuple[PodFacts, str]] = {}
    too_large: set[str] = set()
    held: dict[str, str] = {}
    groups: dict[str, tuple[Gang, list[PodFacts]]] = {}

    def add(gang: Gang) -> None:
        if gang.name in groups:
            return
        uids = fixed.get(gang.name)
        group = [
            p
            for p in members(gang, everywhere.values())
            if exempt_reason(p, settings) is None
            and (p.uid in uids if uids is not None else p.created is None or p.created <= started)
        ]
        groups[gang.name] = (gang, group)
        if len(group) > settings.gang.max_pods:
            too_large.add(gang.name)
        blocker = gang_blocked(group, [d for d in pdbs if d.namespace == gang.namespace])
        if blocker is not None:
            held[gang.name] = f"PodDisruptionBudget {blocker.name} allows "
            held[gang.name] += f"{blocker.disruptions_allowed} disruption(s)"
        for member in group:
            targets[member.uid] = (member, gang.name)

    for pod in _direct_targets(spec, node, pods, settings):
        targets.setdefault(pod.uid, (pod, ""))
        gang = gang_of(pod, settings.gang.kinds) if settings.gang.enabled else None
        if gang is not None:
            add(gang)
    for g in frozen:  # a gang once evicted is followed to the end
        add(frozen_gang(g))
    for rec in previous_waiting:  # followed to the end (gang members on other nodes)
        known = everywhere.get(rec.uid)
        if known is not None and rec.uid not in targets and exempt_reason(known, settings) is None:
            targets[rec.uid] = (known, rec.gang)
    over = _cap(
        spec,
        targets,
        too_large,
        touched=touched,
        evicted_count=evicted_count,
        settings=settings,
        off_limits=off_limits or {},
    )
    plan = _decide(
        targets=targets,
        too_large=too_large,
        held=held,
        over_cap=over,
        gangs=tuple(sorted(groups)),
        settings=settings,
        started=started,
        now=now,
    )
    evicting = {e.gang for e in plan.evict}
    fresh = tuple(
        _freeze(gang, group, now)
        for name, (gang, group) in sorted(groups.items())
        if name in evicting and name not in fixed
    )
    return dataclasses.replace(plan, freeze=fresh, over_cap=over)


def _decide(
    *,
    targets: Mapping[str, tuple[PodFacts, str]],
    too_large: set[str],
    held: Mapping[str, str],
    over_cap: str,
    gangs: tuple[str, ...],
    settings: DrainSettings,
    started: datetime,
    now: datetime,
) -> DrainPlan:
    evict: list[Eviction] = []
    force: list[PodFacts] = []
    waiting: list[PodRecord] = []
    next_change: datetime | None = None

    def wait(pod: PodFacts, gang: str, reason: str, message: str = "") -> None:
        waiting.append(
            PodRecord(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                node=pod.node,
                gang=gang[:512],
                reason=reason,
                message=message,
                at=now,
            )
        )

    for pod, gang in sorted(targets.values(), key=lambda t: (t[0].namespace, t[0].name)):
        rule = rule_for(pod.namespace, settings)
        if pod.deletion_timestamp is not None:
            stuck = now > pod.deletion_timestamp + timedelta(seconds=settings.stuck_after_s)
            if stuck and rule.force and not over_cap:
                force.append(pod)
            wait(pod, gang, "terminating", "stuck" if stuck else "")
        elif gang in too_large:
            wait(pod, gang, "gang-too-large", f"more than {settings.gang.max_pods} pods")
        elif over_cap:
            wait(pod, gang, "over-cap", over_cap)
        elif gang in held:
            wait(pod, gang, "gang-pdb-blocked", held[gang])
        elif rule.mode == "never":
            wait(pod, gang, "never", "namespace drain mode is never")
        elif rule.mode == "wait" and now < started + timedelta(seconds=rule.wait_s):
            until = started + timedelta(seconds=rule.wait_s)
            next_change = until if next_change is None else min(next_change, until)
            wait(pod, gang, "let-finish", f"evicted at {until.isoformat()} unless it finishes")
        else:
            evict.append(Eviction(pod, rule.grace_period_s, gang))
    return DrainPlan(
        evict=tuple(evict),
        force=tuple(force),
        waiting=tuple(waiting),
        targets=len(targets),
        next_change=next_change,
        gangs=gangs,
    )
