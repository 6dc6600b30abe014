"""``gpuhealth_shard_owned{shard}`` follows what the replica owns, scrape by scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.controller.shards.metrics import ShardOwnedCollector


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "gpuhealth_shard_owned"
    ]
    return {s.labels["shard"]: s.value for s in family.samples}


def test_one_series_per_shard_one_for_each_owned() -> None:
    owned = {0, 2}
    registry = CollectorRegistry()
    registry.register(ShardOwnedCollector(lambda: frozenset(owned), 3))
    assert scrape(registry) == {"0": 1.0, "1": 0.0, "2": 1.0}
    owned.discard(0)
    owned.add(1)
    assert scrape(registry) == {"0": 0.0, "1": 1.0, "2": 1.0}
