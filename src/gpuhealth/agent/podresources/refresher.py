"""Keeps the GPU -> container allocations cached; scrapes and status reads never call the kubelet.

A failed refresh keeps the last good allocations (pods rarely move while the kubelet restarts),
logs the error, and counts it. The refresher reports on itself like a source
(:class:`~gpuhealth.agent.sources.base.SourceStatus`: ``gpuhealth_agent_source_up`` and
``gpuhealth_agent_source_errors_total`` with ``source="podresources"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.agent.podresources.mapping import allocations_from_claims, allocations_from_devices
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import Allocation

if TYPE_CHECKING:
    from gpuhealth.agent.podresources.client import PodResourcesClient

log = get_logger("podresources")


def _socket_exists(path: str) -> bool:
    """A local stat: cheap, never blocks on the kubelet."""
    return os.path.exists(path)


PODRESOURCES_REFRESHES = CounterSpec(
    "podresources_refreshes", "PodResources List calls to the kubelet that worked."
)
PODRESOURCES_UNRESOLVED = CounterSpec(
    "podresources_unresolved_devices",
    "DRA devices of a GPU driver (podresources.dra_drivers) that named no GPU the agent knows, "
    "per List call (left out of the allocations).",
)

NOT_READ_YET = "PodResources not read yet"
"""Why the allocations are unknown before the first List worked."""


class PodResourcesRefresher:
    name = "podresources"

    def __init__(
        self,
        settings: PodResourcesSettings,
        clock: Clock,
        on_update: Callable[[list[Allocation]], None],
        directory: Callable[[], DeviceDirectory] | None = None,
        on_unknown: Callable[[str | None], None] | None = None,
    ) -> None:
        """``directory``: the node's GPUs and MIG devices now (from the health engine), to
        resolve MIG UUIDs, index IDs and DRA device names to GPUs. ``on_unknown``: told why
        the allocations cannot be trusted now (a List failed: the last good ones are kept, but
        a pod may have come or gone), and None once a List works again."""
        self._on_unknown = on_unknown
        self._settings = settings
        self._clock = clock
        self._on_update = on_update
        self._directory = directory
        self._client: PodResourcesClient | None = None
        self.allocations: list[Allocation] = []
        self.counters = Counters(PODRESOURCES_REFRESHES, PODRESOURCES_UNRESOLVED)
        self.polls: Histogram | None = None
        self.up = False
        """The last List call worked."""
        self.ready = False
        """A List call has worked."""
        self.errors = 0
        """Failed List calls (the last good allocations are kept)."""
        self.last_error: str | None = None

    async def refresh_once(self) -> bool:
        """One List call; True when it worked. Never raises for kubelet trouble."""
        if self._client is None:
            if not _socket_exists(self._settings.socket):
                return self._failed(f"PodResources socket {self._settings.socket} does not exist")
            # grpc is imported only once a kubelet socket is there (it costs ~10 MiB RSS).
            from gpuhealth.agent.podresources.client import PodResourcesClient

            self._client = PodResourcesClient(self._settings)
        try:
            listed = await self._client.list()
        except TransientError as exc:
            return self._failed(str(exc))
        directory = self._directory() if self._directory is not None else None
        s = self._settings
        allocations = allocations_from_devices(listed.devices, s.resource_prefixes, directory)
        dra, unresolved = allocations_from_claims(listed.claims, s.dra_drivers, directory)
        if dra:
            allocations = sorted(
                allocations + dra,
                key=lambda a: (a.gpu_uuid, a.device_id, a.namespace, a.pod, a.container),
            )
        if unresolved:
            self.counters.inc(PODRESOURCES_UNRESOLVED, unresolved)
        self.counters.inc(PODRESOURCES_REFRESHES)
        if not self.up:
            log.info("podresources_up", socket=self._settings.socket, allocations=len(allocations))
        was_up, self.up, self.ready = self.up, True, True
        self.last_error = None
        if allocations != self.allocations:
            self.allocations = allocations
            self._on_update(allocations)
        if not was_up and self._on_unknown is not None:
            self._on_unknown(None)
        return True

    def _failed(self, message: str) -> bool:
        if self.up or self.last_error != message:
            log.warning("podresources_refresh_failed", error=message, kept=len(self.allocations))
            if self._on_unknown is not None:
                self._on_unknown(f"PodResources: {message}")
        self.up = False
        self.errors += 1
        self.last_error = message
        return False

    async def run(self) -> None:
        """Refresh forever on the configured interval (a supervised task)."""
        try:
            while True:
                await self.refresh_once()
                await self._clock.sleep(self._settings.refresh_interval_s)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
