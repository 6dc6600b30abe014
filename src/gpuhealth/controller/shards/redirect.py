"""Where an agent this replica turns away should go: the shard its Node's label names.

An agent asks the shard of its node's name first (:func:`gpuhealth.protocol.shards.shard_of`);
a node of an NVLink domain belongs to its domain's shard instead (the singleton's label), so
its agent may ask the wrong owner. That owner does not watch the node: :class:`NodeShards`
reads the Node on the API server and the 503 names the shard in ``Gpuhealth-Shard``. The
door is open to anyone before the token review, so the lookup is bounded: an answer (a shard,
or none) is kept ``shards.lookup_ttl_s``, at most ``LOOKUPS_KEPT`` of them, and at most
``shards.lookup_max_concurrent`` reads run at once; beyond that, or when the API server does
not answer, the 503 names no shard and the agent keeps its own (it comes back after
``Retry-After``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from urllib.parse import quote

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.rest import ApiClient, KubeError, NotFoundError, request
from gpuhealth.controller.shards.owner import labelled_shard

log = get_logger("shards")

LOOKUPS_KEPT = 10_000
"""Most answers kept (a node name is at most 253 bytes: about 3 MB)."""


class NodeShards:
    def __init__(
        self,
        api: ApiClient,
        *,
        label: str,
        count: int,
        ttl_s: float,
        max_concurrent: int,
        timeout_s: float,
        clock: Clock,
    ) -> None:
        self._api = api
        self._label = label
        self._count = count
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._slots = asyncio.Semaphore(max_concurrent)
        self._kept: OrderedDict[str, tuple[float, int | None]] = OrderedDict()
        self.reads = 0
        self.refused = 0
        """Lookups not made: every slot busy."""

    async def shard_of(self, node: str) -> int | None:
        """The shard ``node``'s label names, None when it has none, is gone, or is not known
        now."""
        now = self._clock.monotonic()
        kept = self._kept.get(node)
        if kept is not None and now - kept[0] < self._ttl_s:
            return kept[1]
        if self._slots.locked():
            self.refused += 1
            return None
        async with self._slots:
            shard = await self._read(node)
        self._kept[node] = (self._clock.monotonic(), shard)
        self._kept.move_to_end(node)
        while len(self._kept) > LOOKUPS_KEPT:
            self._kept.popitem(last=False)
        return shard

    async def gone(self, node: str) -> bool:
        """The API server no longer has ``node`` (False when it has, or does not answer)."""
        try:
            return await self._labels(node) is None
        except (KubeError, TimeoutError, OSError) as exc:
            log.info("node_existence_unknown", node=node, error=str(exc))
            return False

    async def _read(self, node: str) -> int | None:
        try:
            labels = await self._labels(node)
        except (KubeError, TimeoutError, OSError) as exc:
            log.info("node_shard_unknown", node=node, error=str(exc))
            return None
        return None if labels is None else labelled_shard(labels, self._label, self._count)

    async def _labels(self, node: str) -> Mapping[str, str] | None:
        """The Node's labels as the API server has them; None when it has no such Node."""
        self.reads += 1
        try:
            obj = await request(
                self._api, "GET", f"/api/v1/nodes/{quote(node, safe='')}", timeout_s=self._timeout_s
            )
        except NotFoundError:
            return None
        labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
        return labels
