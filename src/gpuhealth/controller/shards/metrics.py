"""``gpuhealth_shard_owned{shard}``: which shards this replica holds now.

Past one process each replica's ``/metrics`` covers its own shards' nodes (its fleet and
node cache hold nothing else); this gauge says which those are, so that a query sums the
node gauges across replicas without counting a shard twice or missing one (a shard whose
sum over replicas is 0 has no owner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ShardOwnedCollector(Collector):
    def __init__(self, owned: Callable[[], frozenset[int]], count: int) -> None:
        """``owned``: ``ShardLeases.owned``; ``count``: ``shards.count``."""
        self._owned = owned
        self._count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        owned = self._owned()
        g = GaugeMetricFamily(
            "gpuhealth_shard_owned",
            "1 for each shard this replica owns now (holds its Lease), 0 for the others",
            labels=["shard"],
        )
        for i in range(self._count):
            g.add_metric([str(i)], 1.0 if i in owned else 0.0)
        yield g
