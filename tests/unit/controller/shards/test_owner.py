"""A replica's part of the fleet: the node cache scoped to the shards it owns (a node that
leaves is ``left``, never ``deleted``), the owner's work started again for each owned set, a
shard lost no longer served at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuhealth.controller.kube.node_cache import Change, NodeCache
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.leadership.work import LeaderWork, NamedTask
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards.owner import (
    ShardOwner,
    keeps_incident,
    labelled_shard,
    shard_selector,
)
from gpuhealth.controller.shards.settings import ShardSettings
from tests.support.wait import until

LABEL = Keys().shard_label


def node(name: str, shard: int | None, rv: str = "1") -> dict[str, Any]:
    labels = {} if shard is None else {LABEL: str(shard)}
    return {
        "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv, "labels": labels},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


@pytest.mark.parametrize(
    ("shards", "selector"),
    [
        (set(), None),
        ({0}, f"{LABEL} in (0)"),
        ({3, 1, 10}, f"{LABEL} in (1,3,10)"),
    ],
)
def test_the_selector_names_the_owned_shards_in_order(
    shards: set[int], selector: str | None
) -> None:
    assert shard_selector(LABEL, shards) == selector


@pytest.mark.parametrize(
    ("labels", "shard"),
    [
        ({LABEL: "2"}, 2),
        ({LABEL: "0"}, 0),
        ({}, None),
        ({LABEL: "4"}, None),  # no shard of 4: a hand edit
        ({LABEL: "-1"}, None),
        ({LABEL: "x"}, None),
        ({LABEL: ""}, None),
        ({"other": "1"}, None),
    ],
)
def test_a_nodes_shard_is_its_label_when_it_names_one(
    labels: dict[str, str], shard: int | None
) -> None:
    assert labelled_shard(labels, LABEL, 4) == shard


class Heard:
    def __init__(self, cache: NodeCache) -> None:
        self.changes: list[tuple[Change, str]] = []
        cache.subscribe(self.on)

    def on(self, change: Change, old: NodeView | None, new: NodeView | None) -> None:
        view = new or old
        assert view is not None
        self.changes.append((change, view.name))


def in_shards(*shards: int) -> Any:
    return lambda labels: labelled_shard(labels, LABEL, 4) in shards


def test_a_node_outside_the_owned_shards_has_left_not_been_deleted() -> None:
    cache = NodeCache(None)  # fed by hand: no API server
    heard = Heard(cache)
    cache.listed([node("a", 0), node("b", 1), node("c", 1), node("d", 2)], set())
    heard.changes.clear()

    cache.rescope(shard_selector(LABEL, {1, 2}), in_shards(1, 2))
    assert heard.changes == [("left", "a")]
    assert sorted(cache.names()) == ["b", "c", "d"]
    assert not cache.synced.is_set()  # the new part is listed before anything counts on it

    # Relabelled into a shard not owned, or deleted: the selector's watch says DELETED with
    # the Node as it was before, in both cases; it has left.
    cache.apply("DELETED", node("b", 1, rv="2"))
    cache.apply("DELETED", node("c", 1, rv="2"))
    # A relist of the new part that no longer sees d: it left too.
    cache.list_complete({"x"})
    assert heard.changes[1:] == [("left", "b"), ("left", "c"), ("left", "d")]
    # The scoper asked the API server: c is gone. Its listeners hear the deletion once.
    c = NodeView(name="c", resource_version="2")
    cache.tell_deleted(c)
    assert heard.changes[-1] == ("deleted", "c")

    cache.rescope(None, in_shards())
    assert cache.names() == []


def test_one_process_deletes_as_before() -> None:
    cache = NodeCache(None)
    heard = Heard(cache)
    cache.listed([node("a", None), node("b", None)], set())
    cache.apply("DELETED", node("a", None, rv="2"))
    cache.list_complete({"a"})
    assert heard.changes[2:] == [("deleted", "a"), ("deleted", "b")]


@dataclass
class Leases:
    """The shards' Leases as :class:`ShardOwner` reads them."""

    held: set[int] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    shards: ShardSettings = field(default_factory=lambda: ShardSettings(count=4, replicas=2))

    def owned(self) -> frozenset[int]:
        return frozenset(self.held)

    def move(self, *held: int) -> None:
        self.held = set(held)
        self.changed.set()


@dataclass
class Works:
    built: list[frozenset[int]] = field(default_factory=list)
    running: set[frozenset[int]] = field(default_factory=set)
    scopes: int = 0

    def work(self, owned: frozenset[int]) -> LeaderWork:
        self.built.append(owned)

        async def prepare() -> None:
            return None

        async def run() -> None:
            self.running.add(owned)
            try:
                await asyncio.Event().wait()
            finally:
                self.running.discard(owned)

        return LeaderWork(prepare=prepare, tasks=(NamedTask("w", run),))

    async def on_scope(self) -> None:
        self.scopes += 1


async def test_the_owner_follows_its_leases() -> None:
    cache = NodeCache(None)
    listing: list[str | None] = []

    async def watch() -> None:
        listing.append(dict(cache.informer._query).get("labelSelector"))
        cache.listed(
            [node(f"n{i}", i % 4) for i in range(8) if in_scope(node(f"n{i}", i % 4))], set()
        )
        cache.synced.set()
        await asyncio.Event().wait()

    def in_scope(obj: dict[str, Any]) -> bool:
        return owner.in_scope(obj["metadata"]["labels"])

    cache.run = watch  # type: ignore[method-assign]
    leases, works = Leases(), Works()
    gone_asked: list[str] = []

    async def gone(name: str) -> bool:
        gone_asked.append(name)
        return name == "n7"

    published: set[int] = set()
    withdrawn: list[int] = []

    asked: list[int] = []

    def endpoint(shard: int) -> Callable[[], Coroutine[object, object, None]] | None:
        asked.append(shard)
        if shard == 2:
            return None  # a shard with nothing to publish

        async def run() -> None:
            published.add(shard)
            try:
                await asyncio.Event().wait()
            finally:
                published.discard(shard)
                withdrawn.append(shard)

        return run

    owner = ShardOwner(
        leases,  # type: ignore[arg-type]
        cache,
        label=LABEL,
        work=works.work,
        on_scope=works.on_scope,
        gone=gone,
        endpoint=endpoint,
    )
    task = asyncio.create_task(owner.run())
    try:
        await asyncio.sleep(0)
        assert not owner.ready and owner.synced and works.built == []  # nothing owned yet

        leases.move(1, 3)
        await until(lambda: owner.ready, "the work for shards 1 and 3 prepared")
        assert works.built == [frozenset({1, 3})]
        assert listing == [f"{LABEL} in (1,3)"]
        assert sorted(cache.names()) == ["n1", "n3", "n5", "n7"]
        assert owner.serves("n1") and not owner.serves("n0")
        await until(lambda: published == {1, 3}, "both shards' endpoints, once prepared")

        # n5 relabelled into another shard, n7 deleted: both leave, what was held of them
        # goes, and the API server tells which one was deleted.
        scopes = works.scopes
        deleted: list[str] = []

        def on_deleted(change: Change, old: NodeView | None, _new: NodeView | None) -> None:
            if change == "deleted" and old is not None:
                deleted.append(old.name)

        cache.subscribe(on_deleted)
        cache.apply("DELETED", node("n5", 1, rv="9"))
        cache.apply("DELETED", node("n7", 3, rv="9"))
        await until(lambda: works.scopes == scopes + 1, "the drop after nodes left")
        await until(lambda: deleted == ["n7"], "the deletion told")
        assert gone_asked == ["n5", "n7"]
        assert works.built == [frozenset({1, 3})]  # the work goes on
        cache.listed([node("n5", 1, rv="10"), node("n7", 3, rv="10")], set())  # and back

        # Shard 3 lost: no longer served at once, before the owner reacts.
        leases.held = {1}
        assert not owner.serves("n3") and owner.serves("n1")
        leases.changed.set()
        await until(lambda: works.built[-1:] == [frozenset({1})], "the work for shard 1")
        await until(lambda: works.running == {frozenset({1})}, "only the new work runs")
        assert sorted(cache.names()) == ["n1", "n5"]
        assert listing[-1] == f"{LABEL} in (1)"
        assert works.scopes == 3
        # Shard 3's endpoint withdrawn; shard 1's kept through the work's restart.
        assert published == {1} and withdrawn == [3]

        # Shard 2 won: the work starts again for {1, 2}; shard 1's agents are never refused.
        leases.move(1, 2)
        await until(lambda: 2 in asked and owner.ready, "shard 2's endpoint asked once prepared")
        assert published == {1}
        assert withdrawn == [3]
        await asyncio.sleep(0.05)
        assert asked.count(2) == 1  # asked once: nothing waits for shard 2 again (no spin)
        leases.move(1)
        await until(lambda: 2 not in owner.scoped, "shard 2 gone")

        leases.move()
        await until(lambda: works.running == set(), "no work without a shard")
        assert cache.names() == [] and not owner.ready and published == set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert works.running == set()


@pytest.mark.parametrize(
    ("kind", "nodes", "owned", "kept"),
    [
        ("gpu", ("ours",), {1}, True),
        ("unwatched", ("theirs",), {1}, False),
        ("domain", ("theirs", "ours"), {1}, True),  # a domain is one shard's: any member
        ("override", (), {0, 1}, False),  # about no node of ours: never
        ("capability", ("theirs",), {0}, True),  # fleet-wide: shard 0's owner writes it
        ("capability", ("ours",), {1}, False),  # ... and only that owner
    ],
)
def test_each_incident_object_has_one_writer(
    kind: str, nodes: tuple[str, ...], owned: set[int], kept: bool
) -> None:
    got = keeps_incident(kind, nodes, serves=lambda n: n == "ours", owned=lambda: frozenset(owned))
    assert got is kept
