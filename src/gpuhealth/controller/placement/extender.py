"""The scheduler extender's decisions (pure) and its wire types.

kube-scheduler speaks Go's ``encoding/json`` without tags, so the keys are Go field names:
``ExtenderArgs {Pod, Nodes, NodeNames}``, ``ExtenderFilterResult {Nodes, NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}``, ``HostPriorityList [{Host, Score}]``.

Filter: a node fails when it has fewer free usable (healthy or degraded) GPUs than the pod
requests. When even an empty node would not have enough usable GPUs the failure is
*unresolvable* (preempting pods there cannot help). Nodes without an agent pass.
Prioritize: the node's precomputed score; nodes without an agent get
``unknown_node_score``.

Past one process (``shards.count`` > 1) a replica's fleet holds only its shards' nodes. A
node it does not hold is judged from the Node object the scheduler sent (``Nodes``, when
``nodeCacheCapable`` is false): one carrying a gpuhealth ``NoSchedule``/``NoExecute`` taint the
pod does not tolerate fails, unresolvably (every shard's owner writes its nodes' taints); any
other passes, as does a node sent by name only. Its score comes from the owners' summaries
(:mod:`gpuhealth.controller.placement.peer_scores`), else ``unknown_node_score``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from gpuhealth.controller.placement.view import NodeSummary, failure_message, priority_entry


class ExtenderError(ValueError):
    """A request the extender cannot answer (bad JSON, bad quantity)."""


class _Resources(msgspec.Struct, frozen=True):
    limits: dict[str, str | int | float] | None = None
    requests: dict[str, str | int | float] | None = None


class _Container(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    resources: _Resources | None = None
    restart_policy: str | None = None


class Toleration(msgspec.Struct, frozen=True):
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""


class _PodSpec(msgspec.Struct, frozen=True, rename="camel"):
    containers: list[_Container] = []
    init_containers: list[_Container] = []
    tolerations: list[Toleration] = []


class _ObjectMeta(msgspec.Struct, frozen=True):
    name: str = ""
    namespace: str = ""


class Pod(msgspec.Struct, frozen=True):
    """The part of a v1.Pod the extender reads."""

    metadata: _ObjectMeta = _ObjectMeta()
    spec: _PodSpec = _PodSpec()


class NodeList(msgspec.Struct, frozen=True):
    """A v1.NodeList; items stay raw JSON so they can be returned unchanged."""

    items: list[msgspec.Raw] = []


class ExtenderArgs(msgspec.Struct, frozen=True, rename="pascal"):
    pod: Pod | None = None
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct, frozen=True, rename="pascal", omit_defaults=True):
    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = {}
    failed_and_unresolvable_nodes: dict[str, str] = {}
    error: str = ""


class HostPriority(msgspec.Struct, frozen=True, rename="pascal"):
    host: str
    score: int


class _NodeName(msgspec.Struct, frozen=True):
    metadata: _ObjectMeta = _ObjectMeta()


class NodeTaint(msgspec.Struct, frozen=True):
    key: str = ""
    value: str = ""
    effect: str = ""


class _NodeSpec(msgspec.Struct, frozen=True):
    taints: list[NodeTaint] = []


class _NodeTaints(msgspec.Struct, frozen=True):
    metadata: _ObjectMeta = _ObjectMeta()
    spec: _NodeSpec = _NodeSpec()


_node_name_decoder = msgspec.json.Decoder(_NodeName)
_node_taints_decoder = msgspec.json.Decoder(_NodeTaints)

HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""NodeTaint effects that keep a pod off a node (``PreferNoSchedule`` only disfavours it)."""

_QUANTITY = re.compile(r"^\+?([0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_count(value: str | int | float) -> int:
    """An extended-resource quantity as a whole number (they cannot be fractional)."""
    if isinstance(value, bool):
        raise ExtenderError(f"invalid quantity {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer() and value >= 0:
            return int(value)
        raise ExtenderError(f"invalid quantity {value!r}: not a whole number")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise ExtenderError(f"invalid quantity {value!r}: not a whole number")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def _container_request(c: _Container, resource: str) -> int:
    """Extended resources: the request, or the limit when only the limit is set."""
    r = c.resources
    if r is None:
        return 0
    if r.requests is not None and resource in r.requests:
        return parse_count(r.requests[resource])
    if r.limits is not None and resource in r.limits:
        return parse_count(r.limits[resource])
    return 0


def pod_request(pod: Pod, resource: str) -> int:
    """The pod's effective request, as Kubernetes computes it: the larger of (app containers
    + sidecars) and each init container's peak (sidecars started before it + itself)."""
    total = sum(_container_request(c, resource) for c in pod.spec.containers)
    sidecars = 0
    init_peak = 0
    for c in pod.spec.init_containers:
        req = _container_request(c, resource)
        if c.restart_policy == "Always":
            sidecars += req
            peak = sidecars
        else:
            peak = sidecars + req
        init_peak = max(init_peak, peak)
    return max(total + sidecars, init_peak)


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def _reason(s: NodeSummary, need: int) -> str:
    if need < len(s.failure_messages):
        return s.failure_messages[need]
    return failure_message(s.free, need, s.detail)


def filter_nodes(
    names: Sequence[str], need: int, summaries: Mapping[str, NodeSummary]
) -> FilterOutcome:
    """Split ``names`` by whether each node has ``need`` free usable GPUs."""
    if need <= 0:
        return FilterOutcome(passed=list(names), failed={}, unresolvable={})
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    get = summaries.get
    for name in names:
        s = get(name)
        if s is None or s.free >= need:
            passed.append(name)
        elif s.usable < need:
            unresolvable[name] = _reason(s, need)
        else:
            failed[name] = _reason(s, need)
    return FilterOutcome(passed=passed, failed=failed, unresolvable=unresolvable)


def prioritize(
    names: Sequence[str], summaries: Mapping[str, NodeSummary], unknown_score: int
) -> list[HostPriority]:
    get = summaries.get
    out: list[HostPriority] = []
    for name in names:
        s = get(name)
        out.append(HostPriority(host=name, score=unknown_score if s is None else s.score))
    return out


def prioritize_json(
    names: Sequence[str],
    summaries: Mapping[str, NodeSummary],
    unknown_score: int,
    others: Mapping[str, int] | None = None,
) -> bytes:
    """:func:`prioritize` encoded, from the entries precomputed per node (the hot path);
    ``others``: the scores of nodes other shards' owners hold (past one process)."""
    get = summaries.get
    parts: list[bytes] = []
    for name in names:
        s = get(name)
        if s is not None:
            parts.append(s.priority_json)
        elif others is None:
            parts.append(priority_entry(name, unknown_score))
        else:
            parts.append(priority_entry(name, others.get(name, unknown_score)))
    return b"[" + b",".join(parts) + b"]"


def tolerates(toleration: Toleration, taint: NodeTaint) -> bool:
    """Kubernetes' rule: the effect matches (or the toleration names none), and the key
    matches with ``Exists`` (an empty key with ``Exists`` tolerates everything) or with
    ``Equal`` (the default) and the same value."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def blocking_taint(
    taints: Sequence[NodeTaint], owns: Callable[[str], bool], tolerations: Sequence[Toleration]
) -> NodeTaint | None:
    """The first gpuhealth taint that keeps the pod off the node (a hard effect it does not
    tolerate); None: none does."""
    for taint in taints:
        if taint.effect not in HARD_EFFECTS or not owns(taint.key):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def judge_unheld(
    args: ExtenderArgs,
    outcome: FilterOutcome,
    held: Container[str],
    owns: Callable[[str], bool],
) -> FilterOutcome:
    """Past one process: each passed node this replica's fleet does not hold, judged from
    the taints of the Node object the scheduler sent (none sent: it passes)."""
    if args.nodes is None or args.node_names is not None:
        return outcome
    tolerations = args.pod.spec.tolerations if args.pod is not None else []
    passed = set(outcome.passed)
    refused: dict[str, str] = {}
    for raw in args.nodes.items:
        try:
            node = _node_taints_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise ExtenderError(f"invalid node in Nodes: {exc}") from exc
        name = node.metadata.name
        if name in held or name not in passed:
            continue
        taint = blocking_taint(node.spec.taints, owns, tolerations)
        if taint is not None:
            refused[name] = f"gpuhealth: node has taint {taint.key}={taint.value}:{taint.effect}"
    if not refused:
        return outcome
    return FilterOutcome(
        passed=[n for n in outcome.passed if n not in refused],
        failed=outcome.failed,
        unresolvable={**outcome.unresolvable, **refused},
    )


def node_names(args: ExtenderArgs) -> list[str]:
    """Candidate node names: ``NodeNames`` (nodeCacheCapable) or the names in ``Nodes``."""
    if args.node_names is not None:
        return args.node_names
    if args.nodes is None:
        return []
    try:
        return [_node_name_decoder.decode(raw).metadata.name for raw in args.nodes.items]
    except msgspec.DecodeError as exc:
        raise ExtenderError(f"invalid node in Nodes: {exc}") from exc


def filter_result(
    args: ExtenderArgs, names: Sequence[str], outcome: FilterOutcome
) -> ExtenderFilterResult:
    """Answer in the form the scheduler asked in: names for NodeNames, objects for Nodes."""
    if args.node_names is not None or args.nodes is None:
        return ExtenderFilterResult(
            node_names=outcome.passed,
            failed_nodes=outcome.failed,
            failed_and_unresolvable_nodes=outcome.unresolvable,
        )
    dropped = outcome.failed.keys() | outcome.unresolvable.keys()
    items = [raw for name, raw in zip(names, args.nodes.items, strict=True) if name not in dropped]
    return ExtenderFilterResult(
        nodes=NodeList(items=items),
        failed_nodes=outcome.failed,
        failed_and_unresolvable_nodes=outcome.unresolvable,
    )
