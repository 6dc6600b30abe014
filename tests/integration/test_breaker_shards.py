"""The breaker's state per shard in ConfigMaps, against the real API server: an owner of two
shards saves each node's admission to its shard's map and its open breaker to both; a replica
taking over one of them (and owning a third) adopts the open breaker and that shard's window,
never looser; a map read again unchanged is not written again."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.breaker.gate import CircuitBreaker, GateVerdict
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker.shard_store import ShardedBreakerStore, shard_configmap
from gpuhealth.controller.breaker.store import stored_from_data
from gpuhealth.controller.breaker.sync import BreakerSync, stored_state
from gpuhealth.controller.kube.rest import MERGE_PATCH, NotFoundError, request

pytestmark = pytest.mark.integration

NAMESPACE = "default"
SHARD = {"a": 0, "b": 1, "c": 1, "z": 2}
"""Each node's shard, as the owners' node caches have its label."""
SETTINGS = BreakerSettings(max_fraction=0.0, min_nodes=2, window_s=600.0)


class Owner:
    def __init__(self, b: CircuitBreaker) -> None:
        self.b = b

    def reset(self, *, by: str) -> list[str]:
        return self.b.reset()


@pytest.fixture
async def base(api_client: Any, unique_name: Callable[[str], str]) -> AsyncIterator[str]:
    name = unique_name("gpuhealth-breaker")
    yield name
    for i in range(3):
        with contextlib.suppress(NotFoundError):
            await request(
                api_client,
                "DELETE",
                f"/api/v1/namespaces/{NAMESPACE}/configmaps/{shard_configmap(name, i)}",
            )


async def stored(api: Any, base: str, shard: int) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{shard_configmap(base, shard)}"
    return await request(api, "GET", path)


async def test_an_open_breaker_and_its_window_survive_a_shard_takeover(
    api_client: Any, base: str
) -> None:
    first = ShardedBreakerStore(api_client, NAMESPACE, base, {0, 1}, SHARD.get, timeout_s=10)
    assert await first.load() is None  # nothing stored yet: a successful read
    b = CircuitBreaker(SETTINGS, SystemClock())
    await BreakerSync(b, first, Owner(b), SystemClock()).adopt()
    assert b.request("a", 100) is GateVerdict.ALLOW
    assert b.request("b", 100) is GateVerdict.ALLOW
    assert b.request("c", 100) is GateVerdict.TRIP  # the budget of two spent: open
    await first.save(stored_state(b))

    maps = [stored_from_data((await stored(api_client, base, i))["data"]) for i in (0, 1)]
    assert [[e.node for e in m.window] for m in maps] == [["a"], ["b"]]
    assert all(m.open and m.trips == 1 for m in maps)
    with pytest.raises(NotFoundError):
        await stored(api_client, base, 2)  # not owned: not written

    # saved again unchanged: neither map is written (their resourceVersions stay)
    rvs = [(await stored(api_client, base, i))["metadata"]["resourceVersion"] for i in (0, 1)]
    await first.save(stored_state(b))
    assert rvs == [
        (await stored(api_client, base, i))["metadata"]["resourceVersion"] for i in (0, 1)
    ]

    # another replica takes shard 1 over (and owns shard 2): the breaker stays open, b's
    # admission still counts; a's (shard 0, not taken over) is not its
    second = ShardedBreakerStore(api_client, NAMESPACE, base, {1, 2}, SHARD.get, timeout_s=10)
    successor = CircuitBreaker(SETTINGS, SystemClock())
    await BreakerSync(successor, second, Owner(successor), SystemClock()).adopt()
    assert successor.is_open and successor.trips == 1
    assert [n for n, _ in successor.window()] == ["b"]
    assert successor.request("z", 100) is GateVerdict.BLOCK

    # the operator closes shard 1's map only: shard 2's (written open by the successor's
    # save) keeps the union open; closing both closes it
    await second.save(stored_state(successor))
    assert stored_from_data((await stored(api_client, base, 2))["data"]).open
    for shard in (1, 2):
        await request(
            api_client,
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}/configmaps/{shard_configmap(base, shard)}",
            body={"data": {"state": "closed"}},
            content_type=MERGE_PATCH,
        )
        loaded = await second.load()
        assert loaded is not None and loaded.open is (shard == 1)
