"""Leader election with a coordination.k8s.io Lease (kubernetes_asyncio.leaderelection).

Only the leader writes: ``work`` (the reconciler, DRA) runs while this replica holds the
Lease and is cancelled when it loses it; the replica then campaigns again. On a clean
shutdown the leader clears the Lease holder so that the other replica takes over at once
instead of waiting for ``lease_duration_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import KubeError, request
from gpuhealth.controller.settings import LeaderSettings

log = get_logger("leader")

Work = Callable[[], Awaitable[None]]
WORK_RESTART_S = 1.0
"""Pause before re-running leader work that crashed while this replica still leads."""


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        settings: LeaderSettings,
        identity: str,
        work: Work,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.settings = settings
        self.identity = identity
        self._work = work
        self._clock = clock or SystemClock()
        self.is_leader = False
        self.transitions = 0
        self._holding = False
        """Holds the Lease as far as this replica knows (outlives the work on shutdown)."""
        self._work_task: asyncio.Task[object] | None = None

    async def run(self) -> None:
        try:
            await self._campaign()
        finally:
            # the library runs the leader work as a task of its own and does not cancel it
            # when its caller is cancelled: stop it here so nothing writes after shutdown
            work = self._work_task
            if work is not None and work is not asyncio.current_task() and not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def _campaign(self) -> None:
        if not self.settings.enabled:
            await self._lead()
            return
        s = self.settings
        while True:
            lock = LeaseLock(s.lease_name, s.namespace, self.identity, self._api)
            cfg = electionconfig.Config(
                lock=lock,
                lease_duration=s.lease_duration_s,
                renew_deadline=s.renew_deadline_s,
                retry_period=s.retry_period_s,
                onstarted_leading=self._lead,
                onstopped_leading=self._stopped,
            )
            await leaderelection.LeaderElection(cfg).run()
            await self._clock.sleep(s.retry_period_s)

    async def _lead(self) -> None:
        self._work_task = asyncio.current_task()
        self.is_leader = True
        self._holding = True
        self.transitions += 1
        log.info("leading", identity=self.identity)
        try:
            while True:
                try:
                    await self._work()
                    return
                except Exception:
                    log.exception("leader_work_crashed")
                    await self._clock.sleep(WORK_RESTART_S)
        finally:
            self.is_leader = False

    async def _stopped(self) -> None:
        self.is_leader = False
        self._holding = False
        log.warning("lost_leadership", identity=self.identity)

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) if this replica holds it."""
        if not self.settings.enabled or not self._holding:
            return
        self.is_leader = False
        self._holding = False
        path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{self.settings.namespace}"
            f"/leases/{self.settings.lease_name}"
        )
        with contextlib.suppress(KubeError, asyncio.TimeoutError):
            lease = await request(self._api, "GET", path, timeout_s=2.0)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = None
            await request(self._api, "PUT", path, body=lease, timeout_s=2.0)
            log.info("lease_released", identity=self.identity)
