"""What gpuhealth reads of a Node: :class:`NodeView`, parsed from the API's JSON (pure).

The node watch cache (:mod:`gpuhealth.controller.kube.node_cache`) keeps one per Node; the
reconciler, the fleet view, the metrics and the status page read them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuhealth.controller.names import CONDITION_TYPE


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """gpuhealth's Node condition (``GPUHealthy``): read back from the Node, written by the
    reconciler."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the reconciler needs of a Node (from the watch cache or a fresh GET)."""

    name: str
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    """Every taint on the node as the API returns it (foreign ones are written back verbatim)."""
    condition: NodeCondition | None = None
    """The current GPUHealthy condition, if any."""
    gpus: int = 0
    """The GPU resource in status.capacity."""
    uid: str = ""
    """The Node's UID: a bound token names it, and a Node made again under the same name has
    another (:mod:`gpuhealth.controller.stream.bound_tokens`)."""
    unschedulable: bool = False
    """``spec.unschedulable``: the node is cordoned."""
    conditions: tuple[tuple[str, str], ...] = ()
    """(type, status) of the other conditions the cache was asked to watch, only those whose
    status is one it watches for (a healthy node keeps none): managed repairers' signals."""
    owners: tuple[tuple[str, str, str, str], ...] = ()
    """(apiVersion, kind, name, uid) of each ownerReference (a Karpenter NodeClaim owns the
    Nodes it launched)."""
    taints_by: str = ""
    """The field manager that owns ``spec.taints`` (:func:`taints_manager`): its last writer
    while the list is not empty, best effort for who removed a taint by hand."""


def taints_manager(managed_fields: object) -> str:
    """The field manager that owns a Node's ``spec.taints`` per its managedFields: the last
    writer of that atomic list. Empty when nobody owns it: a write that emptied the list
    leaves no owner (and a manager with nothing left, no entry), so who emptied it is not
    known."""
    if not isinstance(managed_fields, list):
        return ""
    for entry in managed_fields:
        if not isinstance(entry, dict) or entry.get("subresource"):
            continue  # nodes/status: the kubelet's and the controller's conditions
        fields = entry.get("fieldsV1")
        spec = fields.get("f:spec") if isinstance(fields, dict) else None
        if isinstance(spec, dict) and "f:taints" in spec:
            return str(entry.get("manager") or "")
    return ""


def _quantity_int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_quantity(resources: object, gpu_resource: str) -> int:
    """The GPUs a Node's ``status.capacity`` or ``status.allocatable`` (``resources``) holds
    of ``gpu_resource``; 0 when absent or not a whole number."""
    if not isinstance(resources, dict):
        return 0
    return _quantity_int(resources.get(gpu_resource, 0))


WatchedConditions = Mapping[str, frozenset[str]]
"""Node condition type -> the statuses worth keeping (others are left out of the view)."""


def node_view(
    obj: dict[str, Any],
    gpu_resource: str = "nvidia.com/gpu",
    watched: WatchedConditions | None = None,
) -> NodeView:
    """Parse a Node (wire JSON) into the reconciler's view; ``watched``: the other conditions
    to keep, and with which statuses."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    condition = None
    others: list[tuple[str, str]] = []
    for c in status.get("conditions") or ():
        kind = c.get("type")
        if kind == CONDITION_TYPE:
            condition = NodeCondition(
                status=c.get("status", "Unknown"),
                reason=c.get("reason", ""),
                message=c.get("message", ""),
            )
        elif watched and kind in watched and (value := str(c.get("status", ""))) in watched[kind]:
            others.append((sys.intern(str(kind)), sys.intern(value)))
    return NodeView(
        name=meta.get("name", ""),
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        taints=tuple(spec.get("taints") or ()),
        condition=condition,
        gpus=gpu_quantity(status.get("capacity"), gpu_resource),
        uid=meta.get("uid", ""),
        unschedulable=bool(spec.get("unschedulable")),
        conditions=tuple(others),
        owners=tuple(
            (
                str(o.get("apiVersion", "")),
                str(o.get("kind", "")),
                str(o.get("name", "")),
                str(o.get("uid", "")),
            )
            for o in meta.get("ownerReferences") or ()
        ),
        taints_by=sys.intern(taints_manager(meta.get("managedFields"))),
    )
