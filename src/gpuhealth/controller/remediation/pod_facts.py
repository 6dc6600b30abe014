"""Pods and PodDisruptionBudgets (wire JSON) as the remediation loop sees them (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from gpuhealth.controller.remediation.facts import (
    PdbFacts,
    PodFacts,
    SelectorRequirement,
    ValidationPodFacts,
)


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return msgspec.convert(value, datetime)
    except msgspec.ValidationError:
        return None


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def gpu_request(spec: Mapping[str, Any], resource: str) -> int:
    """GPUs the pod's containers ask for (limits, else requests; init containers too, the
    way the scheduler counts: the larger of the regular sum and any one init container)."""

    def ask(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        return _quantity(limits.get(resource, requests.get(resource, 0)))

    regular = sum(ask(c) for c in spec.get("containers") or ())
    init = max((ask(c) for c in spec.get("initContainers") or ()), default=0)
    return max(regular, init)


RELEASE_OWNER_KINDS = frozenset({"ReplicaSet", "DaemonSet"})
"""Controllers of gpuhealth's own pods: the controller Deployment's ReplicaSet, the agent
DaemonSet."""


def _release_owned(meta: Mapping[str, Any], own_namespace: str) -> bool:
    if not own_namespace or meta.get("namespace") != own_namespace:
        return False
    return any(
        isinstance(o, Mapping)
        and o.get("controller") is True
        and o.get("apiVersion") == "apps/v1"
        and o.get("kind") in RELEASE_OWNER_KINDS
        for o in meta.get("ownerReferences") or ()
    )


def pod_facts(
    obj: Mapping[str, Any], gpu_resource: str = "nvidia.com/gpu", own_namespace: str = ""
) -> PodFacts:
    """``own_namespace``: gpuhealth's namespace (its pods are recognised by their owner)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))
    return PodFacts(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        owners=tuple(
            (str(o.get("kind", "")), str(o.get("name", "")))
            for o in meta.get("ownerReferences") or ()
            if isinstance(o, Mapping)
        ),
        deletion_timestamp=_time(meta.get("deletionTimestamp")),
        grace_period_s=int(grace) if isinstance(grace, int) else None,
        gpu_request=gpu_request(spec, gpu_resource),
        created=_time(meta.get("creationTimestamp")),
        release_owned=_release_owned(meta, own_namespace),
    )


def pdb_facts(obj: Mapping[str, Any]) -> PdbFacts:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector = spec.get("selector")
    labels: dict[str, str] = {}
    exprs: tuple[SelectorRequirement, ...] = ()
    if isinstance(selector, Mapping):
        labels = _strings(selector.get("matchLabels"))
        exprs = tuple(
            SelectorRequirement(
                key=str(e.get("key", "")),
                operator=str(e.get("operator", "")),
                values=tuple(str(v) for v in e.get("values") or ()),
            )
            for e in selector.get("matchExpressions") or ()
            if isinstance(e, Mapping)
        )
    generation = int(meta.get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    return PdbFacts(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        match_labels=labels,
        match_expressions=exprs,
        selects_all=isinstance(selector, Mapping) and not labels and not exprs,
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        up_to_date=observed >= generation,
    )


def validation_pod_facts(obj: Mapping[str, Any]) -> ValidationPodFacts:
    facts = pod_facts(obj)
    status = obj.get("status") or {}
    return ValidationPodFacts(
        name=facts.name,
        phase=facts.phase,
        uid=facts.uid,
        message=str(status.get("message") or status.get("reason") or ""),
    )
