"""DRA device taints (KEP-5055): one DeviceTaintRule per device of an unhealthy GPU, so only
that GPU is avoided by DRA scheduling, removed when the GPU recovers.

The served group/version is discovered (``resource.k8s.io/v1beta2`` from 1.36, ``v1alpha3``
before); with neither, this component stays idle. An unhealthy GPU is matched to its
ResourceSlice devices through the device attributes ``uuid`` and ``parentUUID`` (the NVIDIA
DRA driver's; a domain-qualified ``<driver>/uuid`` matches too): its own device and every MIG
device carved from it, or only the MIG devices of the instances a confined fault names
(:mod:`gpuhealth.controller.taints.dra_devices`, :mod:`gpuhealth.controller.taints.mig_scope`).
Rules carry the labels ``<prefix>/managed=true`` and ``<prefix>/node=<node>`` so the controller
lists only its own.

A new rule is a hard write: before creating the first new rule of a node in a pass this asks
the hard-write gate (:mod:`gpuhealth.controller.breaker.gate`, kind ``device-taint``). While the
gate says no (the circuit breaker is open) no new rule is created, existing rules stay and rules
of recovered GPUs are still removed; the node is taken up again when the breaker is reset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.breaker.gate import HardWrite, WriteGate
from gpuhealth.controller.kube.rest import (
    ApiClient,
    ConflictError,
    KubeError,
    NotFoundError,
    request,
)
from gpuhealth.controller.names import MANAGED_VALUE, Keys
from gpuhealth.controller.taints.dra_devices import (
    Target,
    index_slices,
    label_value,
    rule_name,
    targets,
)
from gpuhealth.controller.taints.policy import DeviceVerdict
from gpuhealth.controller.taints.settings import DraSettings
from gpuhealth.controller.workqueue import WorkQueue, run_worker

log = get_logger("kube.dra")

GROUP = "resource.k8s.io"
RULE_VERSIONS = ("v1beta2", "v1alpha3")
SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")


async def discover_versions(api: ApiClient, timeout_s: float) -> tuple[str | None, str | None]:
    """The served versions of DeviceTaintRules and ResourceSlices (None: not served)."""
    try:
        group = await request(api, "GET", f"/apis/{GROUP}", timeout_s=timeout_s)
    except NotFoundError:
        return None, None
    served = {str(v.get("version")) for v in group.get("versions") or ()}
    slice_version = next((v for v in SLICE_VERSIONS if v in served), None)
    for version in RULE_VERSIONS:
        if version not in served:
            continue
        data = await request(api, "GET", f"/apis/{GROUP}/{version}", timeout_s=timeout_s)
        if any(r.get("name") == "devicetaintrules" for r in data.get("resources") or ()):
            return version, slice_version
    return None, slice_version


def rules_path(version: str) -> str:
    return f"/apis/{GROUP}/{version}/devicetaintrules"


class DeviceTaints:
    def __init__(
        self,
        api: ApiClient,
        settings: DraSettings,
        keys: Keys,
        *,
        gate: WriteGate,
        clock: Clock | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._api = api
        self._gate = gate
        self.blocked: set[str] = set()
        """Nodes with a new rule the gate refused (taken up again on reset)."""
        self.settings = settings
        self.keys = keys
        self._clock = clock or SystemClock()
        self._timeout = timeout_s
        self.rule_version: str | None = None
        self.slice_version: str | None = None
        self._want: dict[str, tuple[tuple[DeviceVerdict, ...], bool]] = {}
        self._rules: dict[str, dict[str, Any]] = {}
        """Our rules by name (from the last list plus our own writes)."""
        self.queue = WorkQueue(self._clock, backoff_base_s=0.5, backoff_max_s=60.0, name="dra")
        gate.subscribe(on_reset=self.requeue_blocked)
        self.owns: Callable[[str], bool] = lambda _node: True
        """Past one process: whether this replica owns the node's shard now. Another shard's
        rules are its owner's: never synced here (a node this replica does not watch would
        look like one without verdicts, and lose its rules)."""

    def rule_count(self) -> int:
        return len(self._rules)

    def requeue_blocked(self, _reset_nodes: list[str] | None = None) -> None:
        """The breaker was reset: sync every node whose new rules were refused."""
        for node in sorted(self.blocked):
            self.queue.add(node)
        self.blocked.clear()

    def want(self, node: str, devices: tuple[DeviceVerdict, ...], authoritative: bool) -> None:
        """The reconciler's verdict for a node; non-authoritative verdicts never remove rules."""
        if self._want.get(node) != (devices, authoritative):
            self._want[node] = (devices, authoritative)
            self.queue.add(node)

    def forget(self, node: str) -> None:
        """Past one process, ``node`` is another shard's now: its rules are its owner's."""
        self._want.pop(node, None)

    async def discover(self) -> str | None:
        self.rule_version, self.slice_version = await discover_versions(self._api, self._timeout)
        log.info("dra_discovered", rules=self.rule_version, slices=self.slice_version)
        return self.rule_version

    def _rules_path(self) -> str:
        return rules_path(self.rule_version or "")

    async def list_rules(self) -> None:
        data = await request(
            self._api,
            "GET",
            self._rules_path(),
            query=[("labelSelector", f"{self.keys.managed_label}={MANAGED_VALUE}")],
            timeout_s=self._timeout,
        )
        self._rules = {r["metadata"]["name"]: r for r in data.get("items") or ()}
        for rule in self._rules.values():
            node = ((rule.get("metadata") or {}).get("annotations") or {}).get(self.keys.node_label)
            if node:
                self.queue.add(node)

    async def run(self) -> None:
        """While leading: discover, then keep rules in line with the verdicts."""
        if not self.settings.enabled:
            await asyncio.Event().wait()
        while await self.discover() is None or self.slice_version is None:
            await self._clock.sleep(self.settings.rediscover_interval_s)
        await self.list_rules()
        await run_worker(self.queue, self.sync_node, failure_event="dra_sync_failed")

    async def close(self) -> None:
        """Cancel pending delayed retries (after :meth:`run` stopped)."""
        await self.queue.close()

    async def _slices(self, node: str) -> list[dict[str, Any]]:
        data = await request(
            self._api,
            "GET",
            f"/apis/{GROUP}/{self.slice_version}/resourceslices",
            query=[("fieldSelector", f"spec.nodeName={node}")],
            timeout_s=self._timeout,
        )
        return list(data.get("items") or ())

    def _body(self, node: str, verdict: DeviceVerdict, target: Target) -> dict[str, Any]:
        ref = target.ref
        keys = self.keys
        annotations = {keys.node_label: node, keys.gpu_uuid_annotation: verdict.uuid}
        if target.device_uuid is not None and target.device_uuid != verdict.uuid:
            annotations[keys.device_uuid_annotation] = target.device_uuid
        return {
            "apiVersion": f"{GROUP}/{self.rule_version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": rule_name(node, target.key),
                "labels": {keys.managed_label: MANAGED_VALUE, keys.node_label: label_value(node)},
                "annotations": annotations,
            },
            "spec": {
                "deviceSelector": {"driver": ref.driver, "pool": ref.pool, "device": ref.device},
                "taint": {
                    "key": keys.unhealthy_taint,
                    "value": verdict.code,
                    "effect": "NoSchedule",
                },
            },
        }

    async def sync_node(self, node: str) -> bool:
        """Make the node's rules match; False when a device is not published yet (retry)."""
        if self.rule_version is None or (not self.owns(node) and node not in self._want):
            return True  # another shard's node (a node deleted here is still wanted: ())
        devices, authoritative = self._want.get(node, ((), False))
        have = {
            name: r
            for name, r in self._rules.items()
            if ((r.get("metadata") or {}).get("annotations") or {}).get(self.keys.node_label)
            == node
        }
        wanted: dict[str, dict[str, Any]] = {}
        missing: list[str] = []
        if devices:
            s = self.settings
            index = index_slices(await self._slices(node), s.uuid_attribute, s.parent_attribute)
            for d in devices:
                found = targets(d, index)
                if not found:
                    missing.append(d.uuid)
                for target in found:
                    body = self._body(node, d, target)
                    wanted[body["metadata"]["name"]] = body
            if missing:
                log.info("dra_device_not_published", node=node, uuids=missing)
        new = sorted(set(wanted) - set(have))
        refused = bool(new) and not self._allowed(node, new)
        if refused:
            for name in new:
                del wanted[name]
        for name, body in wanted.items():
            old = have.get(name)
            if (
                old is not None
                and old.get("spec", {}).get("taint", {}).get("value")
                == (body["spec"]["taint"]["value"])
                and old.get("spec", {}).get("deviceSelector") == body["spec"]["deviceSelector"]
            ):
                continue
            if old is not None:
                await self._delete(name)
            await self._create(name, body)
        if authoritative:
            for name in set(have) - set(wanted):
                await self._delete(name)
        return refused or not missing

    def _allowed(self, node: str, new: list[str]) -> bool:
        decision = self._gate.request(
            HardWrite(node, "device-taint", detail=f"{len(new)} new DeviceTaintRule(s)")
        )
        if decision.allowed:
            self.blocked.discard(node)
            return True
        self.blocked.add(node)
        log.warning("dra_rules_blocked", node=node, rules=new, reason=decision.reason)
        return False

    async def _create(self, name: str, body: dict[str, Any]) -> None:
        try:
            created = await request(
                self._api, "POST", self._rules_path(), body=body, timeout_s=self._timeout
            )
        except ConflictError:
            created = await request(
                self._api, "GET", f"{self._rules_path()}/{quote(name)}", timeout_s=self._timeout
            )
        self._rules[name] = created
        log.info("dra_rule_created", rule=name)

    async def _delete(self, name: str) -> None:
        try:
            await request(
                self._api, "DELETE", f"{self._rules_path()}/{quote(name)}", timeout_s=self._timeout
            )
        except NotFoundError:
            pass
        except KubeError:
            raise
        self._rules.pop(name, None)
        log.info("dra_rule_deleted", rule=name)
