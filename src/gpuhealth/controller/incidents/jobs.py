"""Which job a pod belongs to (pure), and the API edge that looks pods up and writes the job
incident's Warning Events.

A pod's job is its gang as the drain resolves it (:mod:`gpuhealth.controller.remediation.gang`:
JobSet, Volcano, Kueue, coscheduling, LeaderWorkerSet, Job), named by the object people know: the
JobSet for a JobSet's pods, the controlling owner (a Job) otherwise, the gang's own name for
gangs defined only by labels, the pod itself for a lone pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.events import post_event
from gpuhealth.controller.kube.rest import ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.names import CONTROLLER, EVENT_GPU_JOB_INCIDENT
from gpuhealth.controller.remediation.gang import gang_of
from gpuhealth.controller.remediation.pod_facts import pod_facts

log = get_logger("incidents")

API_VERSIONS = {
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "Pod": "v1",
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1",
}
MAX_EVENT_PODS = 20
"""Pods of one job incident that get the Event too (the owner always does)."""


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    kind: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    def involved(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": API_VERSIONS.get(self.kind, ""),
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            out["uid"] = self.uid
        return out


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}


def _pod_meta(obj: object) -> dict[str, Any]:
    """The metadata a job is found by, whatever the JSON holds (a field of the wrong type is
    left out, never an error)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return {
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "labels": _strings(meta.get("labels")),
        "annotations": _strings(meta.get("annotations")),
        "ownerReferences": [o for o in meta.get("ownerReferences") or () if isinstance(o, Mapping)]
        if isinstance(meta.get("ownerReferences"), list)
        else [],
    }


def job_of(obj: Mapping[str, Any], gang_kinds: Sequence[str]) -> JobRef:
    """The job of a pod (wire JSON; malformed fields are ignored)."""
    meta = _pod_meta(obj)
    pod = pod_facts({"metadata": meta})
    gang = gang_of(pod, gang_kinds)
    if gang is not None and gang.kind == "jobset":
        return JobRef(pod.namespace, "JobSet", gang.match[0][2])
    owners = meta["ownerReferences"]
    owner = next((o for o in owners if o.get("controller") is True), owners[0] if owners else None)
    if owner is not None and owner.get("kind") and owner.get("name"):
        return JobRef(
            pod.namespace, str(owner["kind"]), str(owner["name"]), str(owner.get("uid", ""))
        )
    job_name = pod.labels.get("batch.kubernetes.io/job-name") or pod.labels.get("job-name")
    if job_name:  # a Job's pod by its labels (no ownerReference left, e.g. orphaned)
        uid = pod.labels.get("batch.kubernetes.io/controller-uid") or ""
        return JobRef(pod.namespace, "Job", job_name, uid)
    if gang is not None:
        return JobRef(pod.namespace, f"gang-{gang.kind}", ",".join(v for _, _, v in gang.match))
    return JobRef(pod.namespace, "Pod", pod.name, pod.uid)


class PodJobs(Protocol):
    async def job(self, namespace: str, pod: str) -> JobRef | None: ...


class JobKubeEvents(Protocol):
    async def job_incident(
        self, job: JobRef, pods: Sequence[str], message: str, now: datetime
    ) -> None: ...


class KubePodJobs:
    """Looks pods up (GET, remembered ``ttl_s``): their job, and the Warning Events."""

    def __init__(
        self,
        api: ApiClient,
        *,
        gang_kinds: Sequence[str],
        ttl_s: float,
        timeout_s: float,
        clock: Clock,
        component: str = CONTROLLER,
        max_entries: int = 10000,
    ) -> None:
        self._api = api
        self._kinds = tuple(gang_kinds)
        self._ttl = ttl_s
        self._timeout = timeout_s
        self._clock = clock
        self._component = component
        self._max = max_entries
        self._cache: dict[tuple[str, str], tuple[float, JobRef | None]] = {}

    async def job(self, namespace: str, pod: str) -> JobRef | None:
        now = self._clock.monotonic()
        hit = self._cache.get((namespace, pod))
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}"
        try:
            obj = await request(self._api, "GET", path, timeout_s=self._timeout)
            ref: JobRef | None = job_of(obj, self._kinds)
        except NotFoundError:
            # Gone already (a crashed Job's pod may be deleted before its XID arrives; pods are
            # looked up when they appear, so this is rare): the pod stands for its job, and
            # nothing is remembered (a pod of the same name may come back).
            return JobRef(namespace, "Pod", pod)
        except (KubeError, TimeoutError, OSError) as exc:
            log.warning("incident-pod-lookup-failed", namespace=namespace, pod=pod, error=str(exc))
            return JobRef(namespace, "Pod", pod)
        if len(self._cache) >= self._max:
            self._cache.clear()
        self._cache[(namespace, pod)] = (now, ref)
        return ref

    async def job_incident(
        self, job: JobRef, pods: Sequence[str], message: str, now: datetime
    ) -> None:
        targets = [job.involved()]
        for p in list(pods)[:MAX_EVENT_PODS]:
            ns, _, name = p.partition("/")
            if job.kind == "Pod" and name == job.name:
                continue
            targets.append({"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name})
        for involved in targets:
            try:
                await post_event(
                    self._api,
                    namespace=str(involved["namespace"]),
                    involved=involved,
                    reason=EVENT_GPU_JOB_INCIDENT,
                    message=message,
                    event_type="Warning",
                    component=self._component,
                    now=now,
                    timeout_s=self._timeout,
                )
            except (KubeError, TimeoutError, OSError) as exc:
                log.warning("incident-event-failed", target=involved["name"], error=str(exc))
