"""What ``gpuhealth-controller cleanup`` removes (pure): everything the controller wrote on a
Node or a Pod, and nothing else.

On a Node: every taint whose key is under the prefix (``Keys.owns``, the same rule the
reconciler uses: foreign taints are written back verbatim, in their order), every label and
annotation under the prefix except the operator's own inputs (``Keys.operator_labels``: the
old override labels ``<prefix>/exclude`` and ``<prefix>/remediation``; the overrides
themselves live under ``node-restriction.kubernetes.io/``, outside the prefix), the shard
label the singleton writes past one process (``Keys.shard_label``, under
``node-restriction.kubernetes.io/`` too, whatever the shard count now: a release that had
shards before leaves it), and the
``GPUHealthy`` condition, and what ``<prefix>/guards`` says gpuhealth set besides (the
autoscalers' annotations while still ``true``, the cordon). With ``keep_taints`` the taints
under the prefix, those guards and the ``guards`` annotation stay, so a later install takes
them over as its own (the acknowledgements of taints removed by hand are GPUIncidents, which
an uninstall keeps; the annotations earlier versions kept for them decide nothing and go).
The GPUIncidents and GPURemediations themselves stay with their CRDs: the fleet's history,
adopted by a later install.

Pods: the idle annotation, and the remediation loop's validation pods
(:func:`is_validation_pod`), deleted whole. Their owner, the GPURemediation, outlives the
release (its CRD is kept), so the garbage collector would never delete them.

The Node write is the reconciler's: one JSON merge patch carrying the complete new taint
list and ``metadata.resourceVersion`` (a concurrent writer makes it fail with 409; the caller
re-reads and plans again). The condition goes through ``nodes/status`` as a strategic merge
patch deleting only the element of type ``GPUHealthy`` (conditions merge by ``type``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.controller.fleet.view import taint_text
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.names import (
    CONDITION_TYPE,
    CONTROLLER,
    CORDON_FIELD,
    DISRUPTION_GUARDS,
    GUARD_VALUE,
    MANAGED_BY_LABEL,
    Keys,
)
from gpuhealth.controller.remediation.model import API_VERSION, KIND
from gpuhealth.controller.taints.plan import parse_guards


@dataclass(frozen=True, slots=True)
class NodeCleanup:
    node: str
    resource_version: str
    taints: list[dict[str, Any]] | None = None
    """The node's complete new taint list; None when no taint is removed."""
    removed_taints: tuple[str, ...] = ()
    """``key=value:effect`` of each removed taint."""
    labels: tuple[str, ...] = ()
    """Label keys to remove."""
    annotations: tuple[str, ...] = ()
    """Annotation keys to remove."""
    condition: bool = False
    """Remove the ``GPUHealthy`` condition."""
    uncordon: bool = False
    """Lift the cordon gpuhealth set (``<prefix>/guards`` lists it)."""

    @property
    def writes_node(self) -> bool:
        return (
            self.taints is not None or bool(self.labels) or bool(self.annotations) or self.uncordon
        )

    @property
    def empty(self) -> bool:
        return not self.writes_node and not self.condition

    def patch_body(self) -> dict[str, Any]:
        """A JSON merge patch of the Node, guarded by its resourceVersion (409 if it moved)."""
        meta: dict[str, Any] = {"resourceVersion": self.resource_version}
        if self.labels:
            meta["labels"] = dict.fromkeys(self.labels)
        if self.annotations:
            meta["annotations"] = dict.fromkeys(self.annotations)
        body: dict[str, Any] = {"metadata": meta}
        spec: dict[str, Any] = {}
        if self.taints is not None:
            spec["taints"] = self.taints
        if self.uncordon:
            spec["unschedulable"] = False
        if spec:
            body["spec"] = spec
        return body


def condition_delete_body() -> dict[str, Any]:
    """A strategic merge patch of nodes/status deleting only the ``GPUHealthy`` condition."""
    return {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}


def plan_node_cleanup(view: NodeView, keys: Keys, *, keep_taints: bool = False) -> NodeCleanup:
    ours = [t for t in view.taints if keys.owns(str(t.get("key", "")))]
    taints: list[dict[str, Any]] | None = None
    if ours and not keep_taints:
        taints = [dict(t) for t in view.taints if not keys.owns(str(t.get("key", "")))]
    kept_labels = keys.operator_labels()
    kept_annotations = {keys.guards_annotation} if keep_taints else set()
    guards = (
        set() if keep_taints else parse_guards(view.annotations.get(keys.guards_annotation)).ours
    )
    set_by_us = [
        k for k in DISRUPTION_GUARDS if k in guards and view.annotations.get(k) == GUARD_VALUE
    ]
    return NodeCleanup(
        node=view.name,
        resource_version=view.resource_version,
        taints=taints,
        removed_taints=tuple(taint_text(t) for t in ours) if taints is not None else (),
        labels=tuple(
            sorted(
                k
                for k in view.labels
                if (keys.owns(k) and k not in kept_labels) or k == keys.shard_label
            )
        ),
        annotations=tuple(
            sorted(
                [k for k in view.annotations if keys.owns(k) and k not in kept_annotations]
                + set_by_us
            )
        ),
        condition=view.condition is not None,
        uncordon=CORDON_FIELD in guards and view.unschedulable,
    )


def pod_annotation_patch(pod: Mapping[str, Any], annotation: str) -> dict[str, Any] | None:
    """The merge patch removing ``annotation`` (the idle flag) from a Pod; None without it."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotation not in annotations:
        return None
    return {"metadata": {"annotations": {annotation: None}}}


def is_validation_pod(pod: Mapping[str, Any], keys: Keys) -> bool:
    """A remediation validation pod the controller created: labelled with its episode
    (``<prefix>/remediation-episode``), managed by gpuhealth-controller and owned by a
    GPURemediation (``controller/remediation/pods.py``). A pod that only copies the
    label is someone else's and stays."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if keys.episode_label not in labels:
        return False
    if labels.get(MANAGED_BY_LABEL) != CONTROLLER:
        return False
    return any(
        ref.get("apiVersion") == API_VERSION and ref.get("kind") == KIND
        for ref in meta.get("ownerReferences") or ()
    )
