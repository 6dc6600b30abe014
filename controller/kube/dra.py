"""DRA device taints (KEP-5055): one DeviceTaintRule per unhealthy GPU, so only that GPU is
avoided by DRA scheduling, removed when the GPU recovers.

The served group/version is discovered (``resource.k8s.io/v1beta2`` from 1.36, ``v1alpha3``
before); with neither, this component stays idle. An unhealthy GPU is matched to its
ResourceSlice device through the device attribute ``uuid`` (the NVIDIA DRA driver publishes
it; a domain-qualified ``<driver>/uuid`` matches too). Rules carry the labels
``<prefix>/managed=true`` and ``<prefix>/node=<node>`` so the controller lists only its own.

A new rule is a hard write: before creating the first new rule of a node in a pass this asks
the hard-write gate (:mod:`controller.hard_writes`, kind ``device-taint``). While the gate
says no (the circuit breaker is open) no new rule is created, existing rules stay and rules
of recovered GPUs are still removed; the node is taken up again when the breaker is reset.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio import client

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.hard_writes import HardWrite, WriteGate
from gpuhealth.controller.kube.rest import ConflictError, KubeError, NotFoundError, request
from gpuhealth.controller.policy import DeviceVerdict, Keys
from gpuhealth.controller.settings import DraSettings
from gpuhealth.controller.workqueue import WorkQueue, run_worker

log = get_logger("kube.dra")

GROUP = "resource.k8s.io"
RULE_VERSIONS = ("v1beta2", "v1alpha3")
SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")


@dataclass(frozen=True, slots=True)
class DeviceRef:
    driver: str
    pool: str
    device: str


def label_value(text: str) -> str:
    """A valid label value for ``text`` (hashed when too long or odd)."""
    if len(text) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def rule_name(node: str, uuid: str) -> str:
    base = re.sub(r"[^a-z0-9.-]+", "-", f"gpuhealth-{node}-{uuid}".lower()).strip("-.")
    if len(base) <= 253:
        return base
    return "gpuhealth-" + hashlib.sha256(f"{node}/{uuid}".encode()).hexdigest()


def _attr_string(value: Any) -> str | None:
    if isinstance(value, dict):
        s = value.get("string")
        return s if isinstance(s, str) else None
    return None


def devices_by_uuid(slices: Iterable[dict[str, Any]], uuid_attribute: str) -> dict[str, DeviceRef]:
    """GPU UUID -> (driver, pool, device) over ResourceSlices (v1 and v1beta1 layouts)."""
    out: dict[str, DeviceRef] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for dev in spec.get("devices") or ():
            attrs = dev.get("attributes") or (dev.get("basic") or {}).get("attributes") or {}
            for name, value in attrs.items():
                if name == uuid_attribute or name.endswith("/" + uuid_attribute):
                    uuid = _attr_string(value)
                    if uuid:
                        out[uuid] = DeviceRef(driver, pool, str(dev.get("name", "")))
    return out


async def discover_versions(
    api: client.ApiClient, timeout_s: float
) -> tuple[str | None, str | None]:
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


def managed_label(keys: Keys) -> str:
    """``<prefix>/managed=true`` marks the DeviceTaintRules gpuhealth created."""
    return f"{keys.prefix}/managed"


class DeviceTaints:
    def __init__(
        self,
        api: client.ApiClient,
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

    @property
    def managed_label(self) -> str:
        return managed_label(self.keys)

    @property
    def node_label(self) -> str:
        return f"{self.keys.prefix}/node"

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
            query=[("labelSelector", f"{self.managed_label}=true")],
            timeout_s=self._timeout,
        )
        self._rules = {r["metadata"]["name"]: r for r in data.get("items") or ()}
        for rule in self._rules.values():
            node = ((rule.get("metadata") or {}).get("annotations") or {}).get(self.node_label)
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

    def _body(self, node: str, verdict: DeviceVerdict, ref: DeviceRef) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{self.rule_version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": rule_name(node, verdict.uuid),
                "labels": {self.managed_label: "true", self.node_label: label_value(node)},
                "annotations": {
                    self.node_label: node,
                    f"{self.keys.prefix}/gpu-uuid": verdict.uuid,
                },
            },
            "spec": {
                "deviceSelector": {"driver": ref.driver, "pool": ref.pool, "device": ref.device},
                "taint": {
                    "key": self.keys.unhealthy,
                    "value": verdict.code,
                    "effect": "NoSchedule",
                },
            },
        }

    async def sync_node(self, node: str) -> bool:
        """Make the node's rules match; False when a device is not published yet (retry)."""
        if self.rule_version is None:
            return True
        devices, authoritative = self._want.get(node, ((), False))
        have = {
            name: r
            for name, r in self._rules.items()
            if ((r.get("metadata") or {}).get("annotations") or {}).get(self.node_label) == node
        }
        wanted: dict[str, dict[str, Any]] = {}
        if devices:
            refs = devices_by_uuid(await self._slices(node), self.settings.uuid_attribute)
            missing = [d.uuid for d in devices if d.uuid not in refs]
            if missing:
                log.info("dra_device_not_published", node=node, uuids=missing)
            for d in devices:
                if d.uuid in refs:
                    body = self._body(node, d, refs[d.uuid])
                    wanted[body["metadata"]["name"]] = body
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
        return refused or len(wanted) == len(devices)

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
