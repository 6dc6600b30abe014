"""What only the leader runs (:class:`~gpuhealth.controller.app.LeaderWork`): the reconciler,
the circuit breaker's stored state, DRA device taints, the remediation runner and the leader's
own endpoint for the controller's Service. Built by :mod:`gpuhealth.controller.compose`."""

from __future__ import annotations

import os

from gpuhealth.common.clock import Clock
from gpuhealth.common.config import parse_listen
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.app import LeaderWork, NamedTask
from gpuhealth.controller.breaker.gate import WriteGate
from gpuhealth.controller.breaker.sync import BreakerSync
from gpuhealth.controller.kube.breaker_store import BreakerStore
from gpuhealth.controller.kube.dra import DeviceTaints
from gpuhealth.controller.kube.leader_endpoint import LeaderEndpoint
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.watch import NodeCache
from gpuhealth.controller.settings import ControllerSettings
from gpuhealth.controller.taints.reconciler import Reconciler

POD_IP_ENV = "POD_IP"
"""This replica's pod IP (downward API), published as the Service's endpoint while leading."""

log = get_logger("leader_work")


def build_leader_endpoint(
    cfg: ControllerSettings, api: ApiClient, pod_name: str, clock: Clock
) -> LeaderEndpoint | None:
    """The leader's own endpoint for the controller's Service (``leader.service``)."""
    if not cfg.leader.service:
        return None
    pod_ip = os.environ.get(POD_IP_ENV, "")
    try:
        return LeaderEndpoint(
            api,
            namespace=cfg.leader.namespace,
            service=cfg.leader.service,
            pod_name=pod_name,
            pod_ip=pod_ip,
            port=parse_listen(cfg.listen)[1],
            interval_s=cfg.leader.endpoint_interval_s,
            timeout_s=cfg.reconciler.request_timeout_s,
            clock=clock,
        )
    except ValueError as exc:
        raise ConfigError(
            f"leader.service is set, so ${POD_IP_ENV} must be this pod's IP (downward API "
            f"status.podIP); got {pod_ip!r}"
        ) from exc


def build_leader_work(
    cfg: ControllerSettings,
    api: ApiClient,
    *,
    cache: NodeCache,
    gate: WriteGate,
    reconciler: Reconciler,
    dra: DeviceTaints | None,
    endpoint: LeaderEndpoint | None,
    clock: Clock,
    remediation: NamedTask | None,
) -> LeaderWork:
    """Only the leader writes: the reconciler, the breaker's stored state, DRA rules."""
    persist = cfg.breaker.enabled and not cfg.dry_run
    store = BreakerStore(
        api,
        cfg.leader.namespace,
        cfg.breaker.configmap,
        timeout_s=cfg.reconciler.request_timeout_s,
    )

    state = BreakerSync(gate.breaker, store, gate, clock)

    async def prepare() -> None:
        await cache.synced.wait()
        log.info("leader_work_starting", nodes=len(cache.names()), dry_run=cfg.dry_run)
        if persist:
            await state.adopt()

    tasks = [NamedTask("reconciler", reconciler.run)]
    if persist:
        tasks.append(NamedTask("breaker-state", state.run))
    if dra is not None and not cfg.dry_run:
        tasks.append(NamedTask("dra-device-taints", dra.run))
    if endpoint is not None:  # also in dry-run: it only routes traffic, changes no node
        tasks.append(NamedTask("leader-endpoint", endpoint.run))
    if remediation is not None:  # its disruptive steps ask the gate; dry-run writes nothing
        tasks.append(remediation)
    return LeaderWork(prepare=prepare, tasks=tuple(tasks))
