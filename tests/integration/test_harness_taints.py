"""Issue 2, test 1: node taints are read-modify-write with resourceVersion, retried on 409.

``spec.taints`` is an atomic list: whoever writes it writes all of it. These tests show the
raw API semantics the controller's taint code relies on (controller/kube/ owns the
production version; the helper here is deliberately minimal).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from localkube.objects import GPU_RESOURCE, create_gpu_node

pytestmark = pytest.mark.integration

UNHEALTHY = {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
FOREIGN = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
LATE = {"key": "example.com/late-writer", "value": "yes", "effect": "PreferNoSchedule"}
CONFLICT = 409


def _as_dicts(taints: list[Any] | None) -> list[dict[str, str]]:
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints or []]


async def add_taint(
    core: client.CoreV1Api,
    node_name: str,
    taint: dict[str, str],
    *,
    before_write: Callable[[int], Awaitable[None]] | None = None,
    max_attempts: int = 5,
) -> tuple[int, list[int]]:
    """GET the node, write the whole taint list back under its resourceVersion, retry on 409.

    Returns (attempts used, HTTP statuses of the failed writes). ``before_write`` runs
    between the read and the write of each attempt: a test hook to race another writer.
    """
    failures: list[int] = []
    for attempt in range(1, max_attempts + 1):
        node = await core.read_node(node_name)
        taints = _as_dicts(node.spec.taints)
        if any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in taints):
            return attempt, failures
        node.spec.taints = [*taints, taint]
        if before_write is not None:
            await before_write(attempt)
        try:
            # node.metadata.resourceVersion travels with the body: a conditional write.
            await core.replace_node(node_name, node)
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise
            failures.append(exc.status)
            continue
        return attempt, failures
    raise AssertionError(f"no successful write in {max_attempts} attempts: {failures}")


@pytest.fixture
async def gpu_node(
    api_client: client.ApiClient, unique_name: Callable[[str], str]
) -> AsyncIterator[Any]:
    name = unique_name("gpu")
    node = await create_gpu_node(api_client, name, gpus=8, kwok=False)
    yield node
    await client.CoreV1Api(api_client).delete_node(name)


async def test_rmw_taint_keeps_foreign_taint(api_client: client.ApiClient, gpu_node: Any) -> None:
    core = client.CoreV1Api(api_client)
    name = gpu_node.metadata.name
    assert gpu_node.status.capacity[GPU_RESOURCE] == "8"
    assert gpu_node.status.allocatable[GPU_RESOURCE] == "8"

    await add_taint(core, name, FOREIGN)  # another writer, e.g. a maintenance tool
    attempts, failures = await add_taint(core, name, UNHEALTHY)

    node = await core.read_node(name)
    assert (attempts, failures) == (1, [])
    assert _as_dicts(node.spec.taints) == [FOREIGN, UNHEALTHY]
    assert node.status.capacity[GPU_RESOURCE] == "8"


async def test_stale_resource_version_conflicts_and_retry_wins(
    api_client: client.ApiClient, gpu_node: Any
) -> None:
    core = client.CoreV1Api(api_client)
    name = gpu_node.metadata.name
    await add_taint(core, name, FOREIGN)

    # A write under an old resourceVersion is refused: this is what makes RMW safe.
    stale = await core.read_node(name)
    await add_taint(core, name, LATE)
    stale.spec.taints = [*_as_dicts(stale.spec.taints), UNHEALTHY]
    with pytest.raises(ApiException) as refused:
        await core.replace_node(name, stale)
    assert refused.value.status == CONFLICT
    assert _as_dicts((await core.read_node(name)).spec.taints) == [FOREIGN, LATE]

    # Race a concurrent writer between our read and our write: first write 409s, the
    # retry re-reads and keeps everyone's taints.
    racer = {"key": "example.com/racer", "value": "1", "effect": "NoSchedule"}

    async def concurrent_update(attempt: int) -> None:
        if attempt == 1:
            await add_taint(core, name, racer)

    attempts, failures = await add_taint(core, name, UNHEALTHY, before_write=concurrent_update)
    assert (attempts, failures) == (2, [CONFLICT])
    assert _as_dicts((await core.read_node(name)).spec.taints) == [FOREIGN, LATE, racer, UNHEALTHY]


async def test_strategic_merge_patch_replaces_whole_taint_list(
    api_client: client.ApiClient, gpu_node: Any
) -> None:
    """Why RMW: spec.taints is atomic, so a patch with one taint drops all the others."""
    core = client.CoreV1Api(api_client)
    name = gpu_node.metadata.name
    await add_taint(core, name, FOREIGN)

    await core.patch_node(name, {"spec": {"taints": [UNHEALTHY]}})  # strategic merge patch

    assert _as_dicts((await core.read_node(name)).spec.taints) == [UNHEALTHY]
