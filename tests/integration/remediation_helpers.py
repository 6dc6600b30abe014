"""A remediation harness against the real API server.

Real: the GPURemediation CRD and store (watch cache, status subresource), pods, PDBs,
the Eviction API, Events, the node watch cache, the fleet (fed agent messages as the
stream would). Stand-ins for what phase 2 wires from other parts: the agent (it resets,
validates and reports like one), and the taint writer (it applies ``quarantine_taint`` to
the Node with a guarded patch, as the reconciler will).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import MERGE_PATCH, ConflictError, request
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.action_reports import ReportBook
from gpuhealth.controller.remediation.episode_store import GPURemediationStore
from gpuhealth.controller.remediation.kube_events import RemediationKubeEvents
from gpuhealth.controller.remediation.metrics import RemediationMetrics
from gpuhealth.controller.remediation.node_reader import FleetNodeReader
from gpuhealth.controller.remediation.orders import ORDER_KINDS
from gpuhealth.controller.remediation.pods import RemediationPods
from gpuhealth.controller.remediation.runner import Ports, RemediationRunner
from gpuhealth.controller.remediation.safety import GateDecision, HardWrite
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.controller.remediation.taint import quarantine_taint
from gpuhealth.protocol import Allocation, Condition
from gpuhealth.protocol.remediation import ActionReport, Order, ResetGpuOrder
from tests.support.protocol import T0, gpu_uuid, hello, snapshot, transition
from tests.support.wait import until

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "deploy/helm/gpuhealth/files/crds/gpuremediations.gpuhealth.io.yaml"
CRD_NAME = "gpuremediations.gpuhealth.io"
INCIDENT_CRD_NAME = "gpuincidents.gpuhealth.io"
CRD_FILES = (CRD_FILE, CRD_FILE.with_name(f"{INCIDENT_CRD_NAME}.yaml"))
"""The chart's CRDs: GPURemediation and GPUIncident."""
KEYS = Keys()


def xid48(since: Any = T0) -> Condition:
    return Condition(
        reason="XidError",
        code="xid-48",
        severity="unhealthy",
        action="RESET_GPU",
        xid=48,
        since=since,
    )


def contact_support() -> Condition:
    return Condition(
        reason="RowRemapFailure",
        code="row-remap-failure",
        severity="unhealthy",
        action="CONTACT_SUPPORT",
        since=T0,
    )


async def install_crd(api: client.ApiClient) -> None:
    """Create the chart's CRDs, GPURemediation and GPUIncident (or keep those an earlier test
    created) and wait until the API server serves them."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd_file in CRD_FILES:
        body = yaml.safe_load(crd_file.read_text())
        with contextlib.suppress(ConflictError):
            await request(api, "POST", path, body=body, timeout_s=30)
        name = body["metadata"]["name"]

        async def established(name: str = name) -> bool:
            crd = await request(api, "GET", f"{path}/{name}", timeout_s=10)
            conds = (crd.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        await until(established, f"the {name} CRD established", timeout_s=30)


def alloc(namespace: str, pod: str, node: str, gpu: int) -> Allocation:
    uuid = gpu_uuid(gpu, node)
    return Allocation(namespace=namespace, pod=pod, container="main", gpu_uuid=uuid, device_id=uuid)


class OpenGate:
    def __init__(self) -> None:
        self.requests: list[HardWrite] = []

    def request(self, write: HardWrite) -> GateDecision:
        self.requests.append(write)
        return GateDecision(allowed=True)


@dataclass
class Agent:
    """Acts like the node agents: a reset makes the GPU healthy (the verdict's cause is
    cleared) and is reported through the report book; validation passes."""

    fleet: Fleet
    book: ReportBook
    executed: Counter[str] = field(default_factory=Counter)
    seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1_000_000))

    async def send(self, node: str, req: Order) -> bool:
        self.executed[req.order_id] += 1
        kind = ORDER_KINDS[type(req)]
        if isinstance(req, ResetGpuOrder):
            for uuid in req.gpus:
                index = int(uuid.rsplit("-", 1)[1])
                self.fleet.on_message(node, transition(node, index, "healthy"))
        state = "succeeded" if kind in ("reset-gpu", "validate") else "accepted"
        self.book.record(
            node,
            ActionReport(
                seq=next(self.seq),
                node=node,
                order_id=req.order_id,
                episode=req.episode,
                action=kind,
                state=state,  # type: ignore[arg-type]
                at=SystemClock().now(),
            ),
        )
        return True


class TaintWriter:
    """The reconciler's part: every node carries exactly the quarantine its episodes want."""

    def __init__(self, api: client.ApiClient, store: GPURemediationStore) -> None:
        self.api = api
        self.store = store
        self.requested: Counter[str] = Counter()

    def quarantine(self, node: str) -> None:
        self.requested[node] += 1

    async def apply(self, node: str) -> None:
        want = quarantine_taint(self.store.episodes(), node, KEYS)
        for _ in range(5):
            obj = await request(self.api, "GET", f"/api/v1/nodes/{node}", timeout_s=10)
            taints = [
                t
                for t in (obj.get("spec") or {}).get("taints") or []
                if t.get("key") != KEYS.quarantine_taint
            ]
            if want is not None:
                taints.append({"key": want.key, "value": want.value, "effect": want.effect})
            if taints == ((obj.get("spec") or {}).get("taints") or []):
                return
            body = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                await request(
                    self.api,
                    "PATCH",
                    f"/api/v1/nodes/{node}",
                    body=body,
                    content_type=MERGE_PATCH,
                    timeout_s=10,
                )
                return
            except ConflictError:
                continue


@dataclass
class Harness:
    api: client.ApiClient
    settings: RemediationSettings
    fleet: Fleet = field(default_factory=Fleet)
    book: ReportBook = field(default_factory=ReportBook)
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=False)
    )
    own_namespace: str = ""
    """gpuhealth's namespace (the controller's ``leader.namespace``)."""

    def __post_init__(self) -> None:
        self.store = GPURemediationStore(self.api)
        self.cache = NodeCache(self.api)
        self.pods = RemediationPods(
            self.api,
            KEYS,
            validation=self.settings.validation.pod,
            own_namespace=self.own_namespace,
        )
        self.agent = Agent(self.fleet, self.book)
        self.taints = TaintWriter(self.api, self.store)
        self.gate = OpenGate()
        self.metrics = RemediationMetrics(self.registry)
        ports = Ports(
            store=self.store,
            nodes=FleetNodeReader(self.fleet, self.cache),
            pods=self.pods,
            disruptor=self.pods,
            orders=self.agent,
            reports=self.book,
            quarantiner=self.taints,
            gate=self.gate,
            events=RemediationKubeEvents(self.api),
        )
        self.runner = RemediationRunner(self.settings, KEYS, ports, self.metrics, SystemClock())

    def agent_connects(
        self,
        node: str,
        *,
        faults: dict[int, Condition],
        allocations: list[Allocation],
        gpus: int = 8,
    ) -> None:
        self.fleet.on_connect(node, hello(node, gpus, boot_id=f"boot-{node}"))
        self.fleet.on_message(node, snapshot(node, gpus, faults=faults, allocations=allocations))

    async def round(self, nodes: list[str]) -> None:
        for node in nodes:
            await self.runner.consider(node)
        for ep in [e for e in self.store.episodes() if e.node in nodes]:
            await self.runner.reconcile(ep.name)
        for node in nodes:
            await self.taints.apply(node)

    async def drive(
        self, nodes: list[str], done: Callable[[], bool], what: str, timeout_s: float = 60
    ) -> None:
        async def step() -> bool:
            await self.round(nodes)
            return done()

        try:
            await until(step, what, timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as exc:
            state = {
                e.name: (e.phase.value, e.status.reason, e.status.message)
                for e in self.store.episodes()
                if e.node in nodes
            }
            raise AssertionError(f"{exc}; episodes: {state}") from None

    def episode_of(self, node: str) -> Any:
        eps = [e for e in self.store.episodes() if e.node == node]
        assert len(eps) == 1, [e.name for e in eps]
        return eps[0]


@contextlib.asynccontextmanager
async def running(h: Harness) -> AsyncIterator[Harness]:
    """The watches run (the node cache, the GPURemediation cache) while the test drives."""
    tasks = [
        asyncio.create_task(h.cache.run(), name="node-cache"),
        asyncio.create_task(h.store.run(), name="gpuremediation-cache"),
    ]
    try:
        await until(lambda: h.cache.synced.is_set() and h.store.synced.is_set(), "caches synced")
        yield h
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def quick(**changes: Any) -> RemediationSettings:
    """Everything on, fast retries, no soak; ``changes`` on top."""
    from gpuhealth.controller.remediation.settings import (
        DrainSettings,
        EscalateSettings,
        RebootSettings,
        ResetSettings,
        SafetySettings,
        ValidationSettings,
    )

    base = RemediationSettings(
        enabled=True,
        reset_gpu=ResetSettings(enabled=True),
        reboot=RebootSettings(enabled=True, approval_required=False),
        escalate=EscalateSettings(enabled=True),
        drain=DrainSettings(retry_s=0.5),
        validation=ValidationSettings(soak_s=0.0),
        safety=SafetySettings(
            max_concurrent=1000, max_fraction=1.0, max_unresolved_escalations=1000
        ),
        undelivered_retry_s=0.5,
        quarantine_check_s=0.2,
    )
    return msgspec.structs.replace(base, **changes)
