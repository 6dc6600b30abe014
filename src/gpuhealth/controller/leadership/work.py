"""What only the leader runs (:class:`LeaderWork`): the reconciler, the circuit breaker's
stored state, the incidents' objects, DRA device taints, the remediation runner and the
leader's own endpoint for the controller's Service. Before any of it, its prepare: the node
cache synced, the breaker's stored state adopted, then the incidents (the book, the domain
taints, the blames, the overrides, from their GPUIncidents); until then :attr:`LeaderWork.ready`
is false and ``/readyz`` answers 503. Built by :mod:`gpuhealth.controller.compose`; the elector
(:mod:`gpuhealth.controller.leadership.election`) starts it when this replica wins the Lease
and cancels it when the lead is lost. A part's work is a :class:`NamedTask`, on every replica
(``Controller``'s replica tasks) as here."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import TaskFactory
from gpuhealth.controller.breaker.sync import BreakerSync
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.leadership.endpoint import LeaderEndpoint
from gpuhealth.controller.leadership.settings import LeaderSettings
from gpuhealth.controller.taints.device_taints import DeviceTaints
from gpuhealth.controller.taints.reconciler import Reconciler


@dataclass(frozen=True, slots=True)
class NamedTask:
    name: str
    run: TaskFactory


@dataclass(slots=True)
class LeaderWork:
    """What runs only while this replica holds the Lease."""

    prepare: Callable[[], Awaitable[None]]
    """First: wait for the node cache, load the breaker's stored state (retried until read),
    then adopt the incidents (retried until listed)."""
    tasks: tuple[NamedTask, ...]
    """Then, together until the lead is lost (one crashing restarts them all)."""
    ready: bool = field(default=False, init=False)
    """``prepare`` finished in this leadership term and the tasks run: leader readiness
    (``/readyz``), and what the hard-write gate and every leader write ask besides the Lease
    (``gpuhealth.controller.compose``). False while the breaker's state is not loaded or the
    incidents not adopted."""

    async def run(self) -> None:
        self.ready = False
        try:
            await self.prepare()
            self.ready = True
            async with asyncio.TaskGroup() as tg:
                for t in self.tasks:
                    tg.create_task(t.run(), name=t.name)  # type: ignore[arg-type]
        finally:
            self.ready = False


POD_IP_ENV = "POD_IP"
"""This replica's pod IP (downward API), published as the Service's endpoint while leading."""

log = get_logger("leader_work")


def build_leader_endpoint(
    leader: LeaderSettings,
    api: ApiClient,
    pod_name: str,
    clock: Clock,
    *,
    port: int,
    timeout_s: float,
    service: str | None = None,
) -> LeaderEndpoint | None:
    """The leader's own endpoint for the controller's Service (``leader.service``; past one
    process, a shard's owner's for that shard's ``service``), at the HTTP server's ``port``."""
    if not leader.service:
        return None
    pod_ip = os.environ.get(POD_IP_ENV, "")
    try:
        return LeaderEndpoint(
            api,
            namespace=leader.namespace,
            service=service or leader.service,
            pod_name=pod_name,
            pod_ip=pod_ip,
            port=port,
            interval_s=leader.endpoint_interval_s,
            timeout_s=timeout_s,
            clock=clock,
        )
    except ValueError as exc:
        raise ConfigError(
            f"leader.service is set, so ${POD_IP_ENV} must be this pod's IP (downward API "
            f"status.podIP); got {pod_ip!r}"
        ) from exc


def build_leader_work(
    *,
    cache: NodeCache,
    reconciler: Reconciler,
    breaker_state: BreakerSync | None,
    dra: DeviceTaints | None,
    endpoints: Sequence[LeaderEndpoint],
    remediation: NamedTask | None,
    dry_run: bool,
    adopt_incidents: Callable[[], Awaitable[None]] | None = None,
    incident_mirror: NamedTask | None = None,
) -> LeaderWork:
    """Only the leader writes: the reconciler, the breaker's stored state (``breaker_state``:
    None when it is not kept), the incidents' objects (``incident_mirror``, adopted first by
    ``adopt_incidents``), DRA rules (not in dry run)."""

    async def prepare() -> None:
        await cache.synced.wait()
        log.info("leader_work_starting", nodes=len(cache.names()), dry_run=dry_run)
        if breaker_state is not None:
            await breaker_state.adopt()
        if adopt_incidents is not None:
            await adopt_incidents()

    tasks = [NamedTask("reconciler", reconciler.run)]
    if incident_mirror is not None:  # in dry run too: it asks may_write before each write
        tasks.append(incident_mirror)
    if breaker_state is not None:
        tasks.append(NamedTask("breaker-state", breaker_state.run))
    if dra is not None and not dry_run:
        tasks.append(NamedTask("dra-device-taints", dra.run))
    for endpoint in endpoints:  # also in dry-run: it only routes traffic, changes no node
        tasks.append(NamedTask(f"endpoint-{endpoint.service}", endpoint.run))
    if remediation is not None:  # its disruptive steps ask the gate; dry-run writes nothing
        tasks.append(remediation)
    return LeaderWork(prepare=prepare, tasks=tuple(tasks))
