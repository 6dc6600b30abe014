"""The singleton's shard labels and the shards' sizes, against the real API server: 210 Nodes
(two NVLink domains, one by its clique label, one by its rack label, and non-GPU Nodes) each
labelled with its shard, a domain's Nodes in one shard, a hand edit put back, a new Node
labelled, nothing written while nothing changes, the sizes ConfigMap right and kept right."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import SystemClock
from gpuhealth.controller.kube.rest import MERGE_PATCH, NotFoundError, request
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards.assignment import desired_shard, relabels, shard_of, split
from gpuhealth.controller.shards.labeller import LabellerMetrics, ShardLabeller
from gpuhealth.controller.shards.settings import ShardSettings
from gpuhealth.controller.shards.sizes import ShardSizes, SizesMetrics, parse_sizes, sizes_data
from localkube.objects import gpu_node_body
from tests.support.wait import until

pytestmark = pytest.mark.integration

NAMESPACE = "default"
COUNT = 4
LABEL = Keys("gpuhealth.io").shard_label
CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
KEYS = {"clique_label": CLIQUE, "topology_labels": (RACK,)}
PLAIN, CLIQUE_TRAYS, RACK_TRAYS = 160, 18, 32


class Fleet:
    """This test's Nodes (deleted afterwards) and the labeller over the whole cluster."""

    def __init__(self, api: Any, name: Callable[[str], str]) -> None:
        self.api = api
        self.prefix = name("shard")
        self.clique = f"{self.prefix}-uuid.1"
        self.rack = f"{self.prefix}-rack"
        self.nodes: list[str] = []
        self.settings = ShardSettings(
            count=COUNT,
            sizes_configmap=name("gpuhealth-shards"),
            sizes_interval_s=0.2,
            label_backoff_s=0.05,
        )
        self.registry = CollectorRegistry()
        self.labeller = ShardLabeller(
            api,
            self.settings,
            label=LABEL,
            namespace=NAMESPACE,
            gpu_resource="nvidia.com/gpu",
            watch=WatchSettings(relist_backoff_s=0.2),
            timeout_s=10.0,
            clock=SystemClock(),
            metrics=LabellerMetrics(self.registry),
            **KEYS,
        )
        self.task: asyncio.Task[None] | None = None
        self.marks = 0

    async def node(self, name: str, *, gpus: int = 8, labels: dict[str, str] | None = None) -> str:
        body = gpu_node_body(name, gpus=gpus, kwok=False, labels=labels)
        await request(self.api, "POST", "/api/v1/nodes", body=body)
        self.nodes.append(name)
        return name

    async def create(self) -> None:
        specs: list[tuple[str, int, dict[str, str]]] = []
        for i in range(PLAIN):
            specs.append((f"{self.prefix}-n{i:03d}", 0 if i % 10 == 0 else 8, {}))
        for i in range(CLIQUE_TRAYS):  # GFD's clique label; a rack label too, which it overrides
            specs.append((f"{self.prefix}-c{i:02d}", 4, {CLIQUE: self.clique, RACK: "other"}))
        for i in range(RACK_TRAYS):  # no clique label: grouped by the rack
            specs.append((f"{self.prefix}-r{i:02d}", 4, {RACK: self.rack}))
        for start in range(0, len(specs), 25):
            await asyncio.gather(
                *(self.node(n, gpus=g, labels=lb) for n, g, lb in specs[start : start + 25])
            )

    async def all_nodes(self) -> dict[str, dict[str, Any]]:
        found = await request(self.api, "GET", "/api/v1/nodes")
        return {n["metadata"]["name"]: n for n in found.get("items") or ()}

    async def ours(self) -> dict[str, dict[str, str]]:
        """Our Nodes' labels, as the API server has them now."""
        every = await self.all_nodes()
        return {n: dict(every[n]["metadata"].get("labels") or {}) for n in self.nodes}

    async def wrong(self) -> dict[str, str]:
        return relabels(await self.ours(), COUNT, shard_label=LABEL, **KEYS)

    async def expected_sizes(self) -> list[int]:
        sizes = [0] * COUNT
        for name, node in (await self.all_nodes()).items():
            if int((node["status"].get("capacity") or {}).get("nvidia.com/gpu", "0")) > 0:
                labels = node["metadata"].get("labels") or {}
                sizes[desired_shard(name, labels, COUNT, **KEYS)] += 1
        return sizes

    async def configmap(self) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{self.settings.sizes_configmap}"
        try:
            return await request(self.api, "GET", path)
        except NotFoundError:
            return {}

    async def caught_up(self) -> None:
        """The labeller's watch has seen every change made so far: a mark written to one of
        our Nodes now (a label no shard depends on) reached it."""
        self.marks += 1
        answer = await request(
            self.api,
            "PATCH",
            f"/api/v1/nodes/{self.nodes[-1]}",
            body={"metadata": {"labels": {"gpuhealth-test/mark": str(self.marks)}}},
            content_type=MERGE_PATCH,
        )
        mark = int(answer["metadata"]["resourceVersion"])

        def seen() -> bool:
            rv = self.labeller.informer.resource_version
            return rv.isdigit() and int(rv) >= mark

        await until(seen, "the labeller's watch to catch up", timeout_s=15)

    def written(self) -> float:
        value = self.registry.get_sample_value(
            "gpuhealth_shard_relabels_total", {"result": "written"}
        )
        return value or 0.0


@pytest.fixture
async def fleet(api_client: Any, unique_name: Callable[[str], str]) -> AsyncIterator[Fleet]:
    f = Fleet(api_client, unique_name)
    try:
        yield f
    finally:
        if f.task is not None:
            f.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await f.task
        for name in f.nodes:
            with contextlib.suppress(NotFoundError):
                await request(api_client, "DELETE", f"/api/v1/nodes/{name}")
        with contextlib.suppress(NotFoundError):
            await request(
                api_client,
                "DELETE",
                f"/api/v1/namespaces/{NAMESPACE}/configmaps/{f.settings.sizes_configmap}",
            )


async def test_every_node_gets_its_shard_and_the_sizes_are_kept(fleet: Fleet) -> None:
    await fleet.create()
    assert len(fleet.nodes) >= 200
    fleet.task = asyncio.create_task(fleet.labeller.run(), name="shard-labeller")

    async def labelled() -> bool:
        return not await fleet.wrong()

    await until(labelled, "every Node labelled with its shard", timeout_s=60, interval_s=0.2)
    labels = await fleet.ours()
    assert fleet.written() >= len(fleet.nodes)

    # a domain's Nodes share its shard: the clique's, the rack's (the clique label wins)
    clique = {labels[n][LABEL] for n in fleet.nodes if n.startswith(f"{fleet.prefix}-c")}
    rack = {labels[n][LABEL] for n in fleet.nodes if n.startswith(f"{fleet.prefix}-r")}
    assert clique == {str(shard_of(fleet.clique, COUNT))}
    assert rack == {str(shard_of(fleet.rack, COUNT))}
    plain = {labels[n][LABEL] for n in fleet.nodes if n.startswith(f"{fleet.prefix}-n")}
    assert plain == {str(i) for i in range(COUNT)}  # 160 names hash into every shard
    assert labels[f"{fleet.prefix}-n000"][LABEL] == str(shard_of(f"{fleet.prefix}-n000", COUNT))

    # the sizes: GPU nodes per shard (non-GPU Nodes labelled, not counted)
    async def sizes_right() -> bool:
        data = (await fleet.configmap()).get("data") or {}
        return data == sizes_data(COUNT, await fleet.expected_sizes())

    await until(sizes_right, "the sizes ConfigMap", timeout_s=15, interval_s=0.1)
    data = (await fleet.configmap())["data"]
    ours_gpu = PLAIN - PLAIN // 10 + CLIQUE_TRAYS + RACK_TRAYS
    assert sum(parse_sizes(data, COUNT)) >= ours_gpu

    # quiet: nothing written, not a Node, not the ConfigMap, while the watch and the sizes
    # loop go on
    await fleet.caught_up()
    before = {n: lb for n, lb in (await fleet.ours()).items()}
    rvs = {n: node["metadata"]["resourceVersion"] for n, node in (await fleet.all_nodes()).items()}
    cm_rv = (await fleet.configmap())["metadata"]["resourceVersion"]
    written = fleet.written()
    assert await fleet.labeller.publish_sizes() is False
    await fleet.caught_up()  # the mark on the last Node: the only change
    after = await fleet.all_nodes()
    changed = {n for n in fleet.nodes if after[n]["metadata"]["resourceVersion"] != rvs[n]}
    assert changed == {fleet.nodes[-1]}
    assert fleet.written() == written
    assert (await fleet.configmap())["metadata"]["resourceVersion"] == cm_rv
    assert {n: lb.get(LABEL) for n, lb in before.items()} == {
        n: lb.get(LABEL) for n, lb in (await fleet.ours()).items()
    }

    # a hand edit is put back; a label removed comes back
    edited, removed = fleet.nodes[5], fleet.nodes[7]
    right = labels[edited][LABEL]
    wrong = str((int(right) + 1) % COUNT)
    for node, value in ((edited, wrong), (removed, None)):
        await request(
            fleet.api,
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": {LABEL: value}}},
            content_type=MERGE_PATCH,
        )
    await until(labelled, "the edits put back", timeout_s=15, interval_s=0.1)
    assert (await fleet.ours())[edited][LABEL] == right
    assert fleet.written() == written + 2

    # a new tray of the clique's domain: labelled with the domain's shard, counted
    tray = await fleet.node(f"{fleet.prefix}-c99", gpus=4, labels={CLIQUE: fleet.clique})
    await until(labelled, "the new Node labelled", timeout_s=15, interval_s=0.1)
    assert (await fleet.ours())[tray][LABEL] == str(shard_of(fleet.clique, COUNT))
    await until(sizes_right, "the sizes with the new Node", timeout_s=15, interval_s=0.1)

    # the sizes ConfigMap edited or deleted by hand is put back
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{fleet.settings.sizes_configmap}"
    await request(
        fleet.api, "PATCH", path, body={"data": {"sizes": "[]"}}, content_type=MERGE_PATCH
    )
    await until(sizes_right, "the sizes put back", timeout_s=15, interval_s=0.1)
    await request(fleet.api, "DELETE", path)
    await until(sizes_right, "the sizes written again", timeout_s=15, interval_s=0.1)


async def test_a_new_term_writes_nothing_that_is_right(fleet: Fleet) -> None:
    """A successor (the same labeller, a fresh term) lists the fleet, finds every label and
    the sizes right, and writes nothing."""
    await fleet.create()
    fleet.task = asyncio.create_task(fleet.labeller.run(), name="shard-labeller")

    async def labelled_and_sized() -> bool:
        data = (await fleet.configmap()).get("data") or {}
        return not await fleet.wrong() and data == sizes_data(COUNT, await fleet.expected_sizes())

    await until(labelled_and_sized, "labels and sizes", timeout_s=60, interval_s=0.2)
    fleet.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await fleet.task
    written = fleet.written()
    cm_rv = (await fleet.configmap())["metadata"]["resourceVersion"]

    fleet.task = asyncio.create_task(fleet.labeller.run(), name="shard-labeller")
    await fleet.caught_up()  # the new term's LIST, and the mark after it
    assert await fleet.labeller.publish_sizes() is False
    assert fleet.labeller.stale() == []
    assert fleet.written() == written
    assert (await fleet.configmap())["metadata"]["resourceVersion"] == cm_rv


async def test_owners_read_the_sizes_and_keep_the_last_good(fleet: Fleet) -> None:
    """An owner's reader takes what the singleton wrote; damaged content or another count's
    is refused (counted), the last good sizes kept; before any, the even split."""
    registry = CollectorRegistry()
    reader = ShardSizes(
        fleet.api,
        NAMESPACE,
        fleet.settings.sizes_configmap,
        COUNT,
        poll_interval_s=0.1,
        timeout_s=10.0,
        clock=SystemClock(),
        metrics=SizesMetrics(registry),
    )
    assert await reader.refresh() is None  # nothing written yet
    assert reader.part(100, {0}) == 25

    await fleet.node(f"{fleet.prefix}-a", labels={CLIQUE: fleet.clique})
    fleet.task = asyncio.create_task(fleet.labeller.run(), name="shard-labeller")
    await until(fleet.configmap, "the sizes ConfigMap", timeout_s=15, interval_s=0.1)
    await fleet.caught_up()
    await fleet.labeller.publish_sizes()  # what the watch shows now, written if not yet
    good = tuple(fleet.labeller.sizes())
    assert await reader.refresh() == good
    shard = shard_of(fleet.clique, COUNT)
    assert reader.part(1000, {shard}) == split(1000, good)[shard]

    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{fleet.settings.sizes_configmap}"
    fleet.task.cancel()  # the singleton gone: nothing puts the ConfigMap back
    with contextlib.suppress(asyncio.CancelledError):
        await fleet.task
    fleet.task = None

    def errors(reason: str) -> float:
        value = registry.get_sample_value("gpuhealth_shard_sizes_errors_total", {"reason": reason})
        return value or 0.0

    for data, reason in (
        ({"sizes": "[1, oops"}, "invalid"),
        ({"count": "9", "sizes": "[1,1,1,1,1,1,1,1,1]"}, "count"),
    ):
        await request(fleet.api, "PATCH", path, body={"data": data}, content_type=MERGE_PATCH)
        assert await reader.refresh() == good
        assert errors(reason) == 1
    await request(fleet.api, "DELETE", path)
    assert await reader.refresh() == good
