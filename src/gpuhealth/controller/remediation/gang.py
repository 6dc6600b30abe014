"""Gangs: pods of one job that only work together (pure).

A distributed training job whose member loses its GPU is broken everywhere; evicting only
that member leaves the others holding healthy GPUs while they wait or crash. So the drain
evicts a target pod's whole gang, on every node. A pod's gang is found by the standard
labels and annotations of the common batch systems, most specific first:

============== ====================================================================
jobset         label ``jobset.sigs.k8s.io/jobset-name`` (a JobSet's pods also carry
               Job labels: the JobSet is the gang)
volcano        annotation ``scheduling.k8s.io/group-name`` or
               ``scheduling.volcano.sh/group-name`` (PodGroup); label
               ``volcano.sh/job-name``
kueue          label ``kueue.x-k8s.io/pod-group-name`` (plain pod groups); annotation
               ``kueue.x-k8s.io/workload`` (the admitted Workload)
coscheduling   label ``scheduling.x-k8s.io/pod-group`` (scheduler-plugins)
leaderworkerset label ``leaderworkerset.sigs.k8s.io/group-key`` (one leader+workers
               group), else ``.../name`` with ``.../group-index``
job            label ``batch.kubernetes.io/controller-uid`` (or the legacy
               ``controller-uid``), else ``batch.kubernetes.io/job-name`` / ``job-name``
============== ====================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuhealth.controller.remediation.facts import PodFacts

Source = Literal["label", "annotation"]
Match = tuple[Source, str, str]


@dataclass(frozen=True, slots=True, order=True)
class Gang:
    namespace: str
    kind: str
    match: tuple[Match, ...]
    """Every (source, key, value) a member carries."""

    @property
    def name(self) -> str:
        return f"{self.kind}:" + ",".join(f"{k}={v}" for _, k, v in self.match)

    def label_selector(self) -> str | None:
        """A label selector that finds the members server-side; None when the gang is
        defined by annotations (list the namespace and filter with :meth:`has`)."""
        if any(src != "label" for src, _, _ in self.match):
            return None
        return ",".join(f"{k}={v}" for _, k, v in self.match)

    def has(self, pod: PodFacts) -> bool:
        if pod.namespace != self.namespace:
            return False
        for src, key, value in self.match:
            meta = pod.labels if src == "label" else pod.annotations
            if meta.get(key) != value:
                return False
        return True


def _first(meta: Mapping[str, str], *keys: str) -> tuple[str, str] | None:
    for key in keys:
        value = meta.get(key)
        if value:
            return key, value
    return None


def _match(kind: str, pod: PodFacts) -> tuple[Match, ...] | None:
    labels, ann = pod.labels, pod.annotations
    if kind == "jobset":
        hit = _first(labels, "jobset.sigs.k8s.io/jobset-name")
        return (("label", *hit),) if hit else None
    if kind == "volcano":
        a = _first(ann, "scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
        if a:
            return (("annotation", *a),)
        hit = _first(labels, "volcano.sh/job-name")
        return (("label", *hit),) if hit else None
    if kind == "kueue":
        hit = _first(labels, "kueue.x-k8s.io/pod-group-name")
        if hit:
            return (("label", *hit),)
        a = _first(ann, "kueue.x-k8s.io/workload")
        return (("annotation", *a),) if a else None
    if kind == "coscheduling":
        hit = _first(labels, "scheduling.x-k8s.io/pod-group")
        return (("label", *hit),) if hit else None
    if kind == "leaderworkerset":
        hit = _first(labels, "leaderworkerset.sigs.k8s.io/group-key")
        if hit:
            return (("label", *hit),)
        name = labels.get("leaderworkerset.sigs.k8s.io/name")
        index = labels.get("leaderworkerset.sigs.k8s.io/group-index")
        if name and index is not None:
            return (
                ("label", "leaderworkerset.sigs.k8s.io/name", name),
                ("label", "leaderworkerset.sigs.k8s.io/group-index", index),
            )
        return None
    if kind == "job":
        hit = _first(labels, "batch.kubernetes.io/controller-uid", "controller-uid")
        hit = hit or _first(labels, "batch.kubernetes.io/job-name", "job-name")
        return (("label", *hit),) if hit else None
    return None


def gang_of(pod: PodFacts, kinds: Sequence[str]) -> Gang | None:
    """The pod's gang under the first rule of ``kinds`` that matches, or None."""
    for kind in kinds:
        match = _match(kind, pod)
        if match:
            return Gang(pod.namespace, kind, match)
    return None


def members(gang: Gang, pods: Iterable[PodFacts]) -> list[PodFacts]:
    """The gang's pods among ``pods`` (deduplicated by UID, in a stable order)."""
    seen: dict[str, PodFacts] = {}
    for p in pods:
        if gang.has(p):
            seen.setdefault(p.uid or f"{p.namespace}/{p.name}", p)
    return sorted(seen.values(), key=lambda p: (p.namespace, p.name))
