"""GPU nodes known by their DRA ResourceSlices alone (a node whose GPUs NVIDIA's DRA driver
publishes has neither GPU feature discovery's label nor ``nvidia.com/gpu`` capacity).

:func:`dra_gpu_nodes` is the pure part: the nodes, and how many devices each, in ResourceSlices
of the given drivers. :class:`DraGpuNodes` lists the ResourceSlices (paged) every
``incidents.unwatched.dra_refresh_s`` while this replica leads (only the leader judges
unwatched nodes) and keeps the last answer; a failed LIST keeps it too (a node does not stop
being a GPU node because the API server hiccuped). Needs ``list`` on ``resourceslices``
(the chart grants it with ``dra.enabled``, the default); refused or not served: no node is
recognised this way, logged once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.taints.device_taints import GROUP, discover_versions

log = get_logger("incidents")

PAGE = 500
"""ResourceSlices per LIST page."""


def dra_gpu_nodes(slices: Iterable[Mapping[str, Any]], drivers: Iterable[str]) -> dict[str, int]:
    """Node -> devices published by ``drivers`` (a slice of another driver, without a node,
    or malformed, counts nothing)."""
    wanted = set(drivers)
    out: dict[str, int] = {}
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") not in wanted:
            continue
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node:
            continue
        devices = spec.get("devices")
        out[node] = out.get(node, 0) + (len(devices) if isinstance(devices, list) else 0)
    return out


class DraGpuNodes:
    def __init__(
        self,
        api: ApiClient,
        *,
        drivers: Iterable[str],
        refresh_s: float,
        timeout_s: float,
        clock: Clock,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._api = api
        self._drivers = tuple(drivers)
        self._refresh_s = refresh_s
        self._timeout = timeout_s
        self._clock = clock
        self._leading = leading
        self._version: str | None = None
        self._nodes: dict[str, int] = {}
        self._failing = False

    def nodes(self) -> Mapping[str, int]:
        """Node -> GPU devices its ResourceSlices publish (the last LIST that worked)."""
        return self._nodes

    async def refresh(self) -> bool:
        """One LIST of every ResourceSlice; True when it worked."""
        try:
            if self._version is None:
                _, self._version = await discover_versions(self._api, self._timeout)
                if self._version is None:
                    return self._failed("ResourceSlices are not served")
            items: list[Mapping[str, Any]] = []
            token = ""
            while True:
                query = [("limit", str(PAGE))] + ([("continue", token)] if token else [])
                data = await request(
                    self._api,
                    "GET",
                    f"/apis/{GROUP}/{self._version}/resourceslices",
                    query=query,
                    timeout_s=self._timeout,
                )
                items += [o for o in data.get("items") or () if isinstance(o, Mapping)]
                token = str((data.get("metadata") or {}).get("continue") or "")
                if not token:
                    break
        except (KubeError, TimeoutError, OSError) as exc:
            return self._failed(str(exc))
        self._nodes = dra_gpu_nodes(items, self._drivers)
        self._failing = False
        return True

    def _failed(self, why: str) -> bool:
        if not self._failing:
            log.warning("dra-gpu-nodes-unknown", error=why, kept=len(self._nodes))
        self._failing = True
        return False

    async def run(self) -> None:
        """The named task ``dra-gpu-nodes``: a LIST every ``refresh_s`` while leading."""
        while True:
            if self._drivers and self._leading():
                await self.refresh()
            await self._clock.sleep(self._refresh_s)
