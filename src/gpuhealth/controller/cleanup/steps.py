"""``gpuhealth-controller cleanup``: remove what the controller wrote, before it is uninstalled.

Helm deletes the objects of a release, not what its controller wrote elsewhere. The chart runs
this as a pre-delete hook Job (``templates/cleanup-hook.yaml``), while the release's objects
still exist, in this order:

1. **Stop the controller** (``stop_deployment``): scale its Deployment to 0 and wait until its
   pods are gone; then wait until the leader Lease is free (given up on a clean stop, or not
   renewed for its duration, timed on this process's monotonic clock). A controller that
   still leads would write everything back, so nothing is removed before that, and a
   cleanup started by hand beside a running controller fails instead of fighting it.
2. **Nodes**: each Node's plan (:mod:`gpuhealth.controller.cleanup.plan`): taints under the prefix,
   our labels and annotations in one merge patch guarded by the resourceVersion (a 409
   re-reads and plans again), then the ``GPUHealthy`` condition.
3. **DeviceTaintRules** labelled ``<prefix>/managed=true``, when the cluster serves them.
4. **Pods**: the idle annotation (only when the configuration says the controller writes it),
   and the remediation loop's validation pods in their namespace (only with a validation pod
   configured): deleted, ours only (``cleanup_plan.is_validation_pod``). Their owner, the
   GPURemediation, stays with its kept CRD, so the garbage collector would not delete them.
5. **The leader's EndpointSlice** (the Service's garbage collector would delete it too), and
   past one process each shard owner's (``<leader.service>-shard-<i>-leader``).
6. **The controller's own ConfigMaps**: the circuit breaker's (``breaker.configmap``, which
   the controller creates: a chart that rendered it had it emptied by ``helm upgrade
   --force``) and the CA it published for the agents (``tls.ca_configmap``); past one
   process also each shard's breaker state (``<breaker.configmap>-shard-<i>``) and the
   shards' sizes (``shards.sizes_configmap``). The Secret of a certificate the controller
   keeps itself stays (a reinstall keeps its CA).

Past one process (``shards.count`` above 1) the controller is stopped when the one Lease and
every shard's Lease (``<leader.lease_name>-shard-<i>``) are free: an owner still running would
write its shard's taints back, the singleton its shard labels.

A clean controller shutdown (a restart, an upgrade) removes none of this: only this command
does. Every step is idempotent; a failed run can simply run again.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.cleanup.plan import (
    NodeCleanup,
    condition_delete_body,
    is_validation_pod,
    plan_node_cleanup,
    pod_annotation_patch,
)
from gpuhealth.controller.cleanup.settings import CleanupSettings
from gpuhealth.controller.kube.lease import LeaseClient
from gpuhealth.controller.kube.node_view import node_view
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    STRATEGIC_PATCH,
    ApiClient,
    ConflictError,
    KubeError,
    NotFoundError,
    list_pages,
    request,
)
from gpuhealth.controller.leadership.endpoint import slice_name
from gpuhealth.controller.names import MANAGED_VALUE, Keys
from gpuhealth.controller.taints.device_taints import discover_versions, rules_path

log = get_logger("kube.cleanup")


class CleanupError(TransientError):
    """The cleanup could not finish (the controller did not stop, or writes failed); running
    it again is safe."""


@dataclass(frozen=True, slots=True)
class CleanupTarget:
    """What to clean, from the controller's configuration and the command's flags."""

    keys: Keys
    namespace: str
    """The controller's namespace (its Deployment, Lease, EndpointSlice)."""
    deployment: str = ""
    """The controller's Deployment to scale to 0 first; empty: do not stop anything."""
    lease: str = ""
    """The leader Lease that must be free before anything is removed; empty: no check."""
    shard_leases: tuple[str, ...] = ()
    """The shards' Leases, each of which must be free too (past one process)."""
    service: str = ""
    """The controller's Service, whose leader EndpointSlice is deleted; empty: none."""
    shard_services: tuple[str, ...] = ()
    """The shards' Services, whose owners' EndpointSlices are deleted (past one process)."""
    idle_annotation: str = ""
    """The pod annotation of idle allocations; empty: the controller does not write it."""
    validation_namespace: str = ""
    """Where the remediation loop creates its validation pods; empty: it creates none."""
    keep_taints: bool = False
    configmaps: tuple[str, ...] = ()
    """The controller's own ConfigMaps in its namespace (the breaker's, the published CA; past
    one process each shard's breaker state and the shards' sizes)."""


@dataclass(slots=True)
class CleanupCounts:
    nodes: int = 0
    taints: int = 0
    labels: int = 0
    annotations: int = 0
    conditions: int = 0
    device_taint_rules: int = 0
    pods: int = 0
    validation_pods: int = 0
    endpoint_slices: int = 0
    configmaps: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {k: v for k, v in self.as_dict().items() if k != "failures"}

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "taints": self.taints,
            "labels": self.labels,
            "annotations": self.annotations,
            "conditions": self.conditions,
            "device_taint_rules": self.device_taint_rules,
            "pods": self.pods,
            "validation_pods": self.validation_pods,
            "endpoint_slices": self.endpoint_slices,
            "configmaps": self.configmaps,
            "failures": list(self.failures),
        }


class ClusterCleanup:
    def __init__(
        self,
        api: ApiClient,
        target: CleanupTarget,
        settings: CleanupSettings,
        *,
        dry_run: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.target = target
        self.settings = settings
        self.dry_run = dry_run
        self._clock = clock or SystemClock()
        self._timeout = settings.request_timeout_s
        self.counts = CleanupCounts()
        self._lease_seen: dict[str, tuple[str, float]] = {}
        """Per held Lease: (resourceVersion, when this process first saw it)."""

    async def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return await request(self._api, method, path, timeout_s=self._timeout, **kw)

    async def run(self) -> CleanupCounts:
        await self.stop_controller()
        await self.clean_nodes()
        await self.clean_device_taint_rules()
        await self.clean_pods()
        await self.delete_validation_pods()
        await self.delete_endpoint_slice()
        await self.delete_configmaps()
        log.info("cleanup_done", dry_run=self.dry_run, **self.counts.summary())
        if self.counts.failures:
            raise CleanupError("cleanup incomplete: " + "; ".join(self.counts.failures))
        return self.counts

    # -- 1. the controller stops ---------------------------------------------------------

    async def stop_controller(self) -> None:
        t = self.target
        if self.dry_run:  # stops nothing, waits for nothing
            return
        deadline = self._clock.monotonic() + self.settings.stop_timeout_s
        if t.deployment:
            ns, name = quote(t.namespace), quote(t.deployment)
            path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"
            try:
                dep = await self._request("GET", path)
            except NotFoundError:
                dep = None
            if dep is not None:
                await self._request(
                    "PATCH", path, body={"spec": {"replicas": 0}}, content_type=MERGE_PATCH
                )
                match = ((dep.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
                log.info("cleanup_stopping_controller", deployment=t.deployment)
                await self._wait(lambda: self._no_pods(selector), deadline, "its pods to go")
        for lease in (t.lease, *t.shard_leases) if t.lease else t.shard_leases:
            await self._wait(
                functools.partial(self._lease_free, lease),
                deadline,
                f"its Lease {lease} to be free",
            )

    async def _wait(self, check: Callable[[], Awaitable[bool]], deadline: float, what: str) -> None:
        while not await check():
            if self._clock.monotonic() >= deadline:
                raise CleanupError(
                    f"the controller did not stop within {self.settings.stop_timeout_s:g}s "
                    f"(waiting for {what}); nothing was removed"
                )
            await self._clock.sleep(self.settings.poll_interval_s)

    async def _no_pods(self, selector: str) -> bool:
        pods = await self._request(
            "GET",
            f"/api/v1/namespaces/{quote(self.target.namespace)}/pods",
            query=[("labelSelector", selector)] if selector else [],
        )
        return not pods.get("items")

    async def _lease_free(self, lease: str) -> bool:
        """Free: no holder, or unchanged for its whole duration as observed here."""
        record = await LeaseClient(self._api, self.target.namespace, lease).get(
            timeout_s=self._timeout
        )
        if record is None or not record.holder:
            return True
        now = self._clock.monotonic()
        seen = self._lease_seen.get(lease)
        if seen is None or seen[0] != record.resource_version:
            self._lease_seen[lease] = (record.resource_version, now)
            log.info("cleanup_lease_held", lease=lease, holder=record.holder)
            return False
        return now - seen[1] >= record.duration_s

    # -- 2. nodes --------------------------------------------------------------------------

    async def _pages(self, path: str, selector: str = "") -> AsyncIterator[dict[str, Any]]:
        """Every object of the collection, a page of ``cleanup.page_size`` at a time."""
        async for page in list_pages(
            self._api,
            path,
            query=[("labelSelector", selector)] if selector else [],
            limit=self.settings.page_size,
            timeout_s=self._timeout,
        ):
            for item in page.items:
                yield item

    async def clean_nodes(self) -> None:
        async for obj in self._pages("/api/v1/nodes"):
            name = str((obj.get("metadata") or {}).get("name", ""))
            try:
                await self._clean_node(obj)
            except KubeError as exc:
                self.counts.failures.append(f"node {name}: {exc}")
                log.warning("cleanup_node_failed", node=name, error=str(exc))

    async def _clean_node(self, obj: dict[str, Any]) -> None:
        keys, keep = self.target.keys, self.target.keep_taints
        plan = plan_node_cleanup(node_view(obj), keys, keep_taints=keep)
        if plan.empty:
            return
        path = f"/api/v1/nodes/{quote(plan.node)}"
        for attempt in range(self.settings.conflict_retries + 1):
            if not plan.writes_node or self.dry_run:
                break
            try:
                await self._request("PATCH", path, body=plan.patch_body(), content_type=MERGE_PATCH)
                break
            except NotFoundError:
                return
            except ConflictError:
                if attempt == self.settings.conflict_retries:
                    raise
                try:
                    fresh = await self._request("GET", path)
                except NotFoundError:
                    return
                plan = plan_node_cleanup(node_view(fresh), keys, keep_taints=keep)
        if plan.condition and not self.dry_run:
            try:
                await self._request(
                    "PATCH",
                    f"{path}/status",
                    body=condition_delete_body(),
                    content_type=STRATEGIC_PATCH,
                )
            except NotFoundError:
                return
        self._count(plan)

    def _count(self, plan: NodeCleanup) -> None:
        if plan.empty:
            return
        r = self.counts
        r.nodes += 1
        r.taints += len(plan.removed_taints)
        r.labels += len(plan.labels)
        r.annotations += len(plan.annotations)
        r.conditions += int(plan.condition)
        log.info(
            "cleanup_node",
            node=plan.node,
            taints=list(plan.removed_taints),
            labels=list(plan.labels),
            annotations=list(plan.annotations),
            condition=plan.condition,
            uncordon=plan.uncordon,
            dry_run=self.dry_run,
        )

    # -- 3. DeviceTaintRules -----------------------------------------------------------------

    async def clean_device_taint_rules(self) -> None:
        version, _ = await discover_versions(self._api, self._timeout)
        if version is None:
            return
        found = await self._request(
            "GET",
            rules_path(version),
            query=[("labelSelector", f"{self.target.keys.managed_label}={MANAGED_VALUE}")],
        )
        for rule in found.get("items") or ():
            name = str(rule["metadata"]["name"])
            if not self.dry_run:
                try:
                    await self._request("DELETE", f"{rules_path(version)}/{quote(name)}")
                except NotFoundError:
                    continue
            self.counts.device_taint_rules += 1
            log.info("cleanup_device_taint_rule", rule=name, dry_run=self.dry_run)

    # -- 4. pods -------------------------------------------------------------------------------

    async def clean_pods(self) -> None:
        key = self.target.idle_annotation
        if not key:
            return
        async for pod in self._pages("/api/v1/pods"):
            body = pod_annotation_patch(pod, key)
            if body is None:
                continue
            meta = pod["metadata"]
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            if not self.dry_run:
                try:
                    await self._request(
                        "PATCH",
                        f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}",
                        body=body,
                        content_type=MERGE_PATCH,
                    )
                except NotFoundError:
                    continue
                except KubeError as exc:
                    self.counts.failures.append(f"pod {ns}/{name}: {exc}")
                    continue
            self.counts.pods += 1
            log.info("cleanup_pod", namespace=ns, pod=name, dry_run=self.dry_run)

    async def delete_validation_pods(self) -> None:
        ns = self.target.validation_namespace
        if not ns:
            return
        episode = self.target.keys.episode_label
        async for pod in self._pages(f"/api/v1/namespaces/{quote(ns)}/pods", episode):
            meta = pod.get("metadata") or {}
            if not is_validation_pod(pod, self.target.keys) or meta.get("deletionTimestamp"):
                continue
            name = str(meta.get("name", ""))
            if not self.dry_run:
                try:
                    await self._request(
                        "DELETE",
                        f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}",
                        body={"preconditions": {"uid": meta.get("uid")}},
                    )
                except NotFoundError:
                    continue
                except KubeError as exc:
                    self.counts.failures.append(f"validation pod {ns}/{name}: {exc}")
                    continue
            self.counts.validation_pods += 1
            log.info("cleanup_validation_pod", namespace=ns, pod=name, dry_run=self.dry_run)

    # -- 5. the leader's EndpointSlice ----------------------------------------------------------

    async def delete_endpoint_slice(self) -> None:
        services = (self.target.service, *self.target.shard_services)
        for name in [slice_name(service) for service in services if service]:
            path = (
                f"/apis/discovery.k8s.io/v1/namespaces/{quote(self.target.namespace)}"
                f"/endpointslices/{quote(name)}"
            )
            if self.dry_run:
                return
            try:
                await self._request("DELETE", path)
            except NotFoundError:
                continue
            self.counts.endpoint_slices += 1
            log.info("cleanup_endpoint_slice", endpoint_slice=name)

    # -- 6. the controller's own ConfigMaps -----------------------------------------------------

    async def delete_configmaps(self) -> None:
        for name in self.target.configmaps:
            path = f"/api/v1/namespaces/{quote(self.target.namespace)}/configmaps/{quote(name)}"
            if self.dry_run:
                continue
            try:
                await self._request("DELETE", path)
            except NotFoundError:
                continue
            except KubeError as exc:
                self.counts.failures.append(f"configmap {name}: {exc}")
                continue
            self.counts.configmaps += 1
            log.info("cleanup_configmap", configmap=name)
