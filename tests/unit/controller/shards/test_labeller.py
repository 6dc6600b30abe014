"""What the singleton keeps of each Node (fed as its watch feeds it, no API server): which
Nodes need a label, which do not, a write's answer outrunning the watch, the sizes counted by
GPU nodes and by domain. The writes themselves: tests/integration/test_shard_labeller.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards.labeller import ShardLabeller
from gpuhealth.controller.shards.settings import ShardSettings
from gpuhealth.protocol.shards import shard_of
from tests.support.clock import FakeClock

LABEL = Keys("gpuhealth.io").shard_label
CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
COUNT = 4


def labeller() -> ShardLabeller:
    return ShardLabeller(
        None,  # type: ignore[arg-type]  # nothing here reaches the API server
        ShardSettings(count=COUNT),
        label=LABEL,
        namespace="gpuhealth",
        clique_label=CLIQUE,
        topology_labels=[RACK],
        gpu_resource="nvidia.com/gpu",
        watch=WatchSettings(),
        timeout_s=5.0,
        clock=FakeClock(),
    )


def node(
    name: str,
    rv: int,
    *,
    labels: dict[str, str] | None = None,
    capacity: str | None = "8",
    allocatable: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if capacity is not None:
        status["capacity"] = {"nvidia.com/gpu": capacity}
    if allocatable is not None:
        status["allocatable"] = {"nvidia.com/gpu": allocatable}
    return {
        "metadata": {"name": name, "resourceVersion": str(rv), "labels": labels or {}},
        "status": status,
    }


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def right(name: str, key: str | None = None) -> str:
    return str(shard_of(key or name, COUNT))


def test_nodes_without_their_shards_label_are_stale_and_right_ones_are_not() -> None:
    lab = labeller()
    lab.informer.on_line(event("ADDED", node("a", 1)))
    lab.informer.on_line(event("ADDED", node("b", 2, labels={LABEL: right("b")})))
    wrong = str((int(right("c")) + 1) % COUNT)
    lab.informer.on_line(event("ADDED", node("c", 3, labels={LABEL: wrong})))
    lab.informer.on_line(event("ADDED", node("d", 4, labels={CLIQUE: "dom.1", LABEL: right("d")})))
    assert right("d") != right("d", "dom.1")  # labelled by its name, not its domain
    assert lab.stale() == ["a", "c", "d"]
    lab.informer.on_line(event("DELETED", node("a", 5)))
    assert lab.stale() == ["c", "d"]


def test_an_older_event_does_not_undo_what_a_write_answered() -> None:
    """The answer to a write (rv 10) is kept over a watch event from before it (rv 9): the
    Node is not handed out again until a newer version shows a wrong label."""
    lab = labeller()
    lab.informer.on_line(event("ADDED", node("a", 9)))
    assert lab.stale() == ["a"]
    lab.observe(node("a", 10, labels={LABEL: right("a")}))
    assert lab.stale() == []
    lab.informer.on_line(event("MODIFIED", node("a", 9)))  # the watch, late
    assert lab.stale() == []
    lab.informer.on_line(event("MODIFIED", node("a", 11, labels={LABEL: "x"})))  # a hand edit
    assert lab.stale() == ["a"]


def test_a_stale_node_is_queued_once() -> None:
    lab = labeller()
    for rv in (1, 2, 3):
        lab.informer.on_line(event("MODIFIED", node("a", rv)))
    assert lab.queued() == 1


def test_sizes_count_gpu_nodes_by_the_shard_they_must_be_in() -> None:
    lab = labeller()
    lab.informer.on_line(event("ADDED", node("cpu", 1, capacity=None)))
    lab.informer.on_line(event("ADDED", node("zero", 2, capacity="0")))
    lab.informer.on_line(event("ADDED", node("alloc", 3, capacity=None, allocatable="4")))
    lab.informer.on_line(event("ADDED", node("junk", 4, capacity="lots")))
    for i in range(5):
        lab.informer.on_line(event("ADDED", node(f"t{i}", 10 + i, labels={RACK: "r1"})))
    sizes = [0] * COUNT
    sizes[shard_of("alloc", COUNT)] += 1
    sizes[shard_of("r1", COUNT)] += 5
    assert lab.sizes() == sizes
    assert set(lab.stale()) == {"cpu", "zero", "alloc", "junk", "t0", "t1", "t2", "t3", "t4"}


@pytest.mark.parametrize(
    ("labels", "shard_key"),
    [
        ({CLIQUE: "c.1", RACK: "r5"}, "c.1"),
        ({RACK: "r5"}, "r5"),
        ({}, "n"),
    ],
)
def test_the_label_wanted_is_the_domains_shard(labels: dict[str, str], shard_key: str) -> None:
    lab = labeller()
    assert len({right("n"), right("c.1"), right("r5")}) == 3
    lab.informer.on_line(event("ADDED", node("n", 1, labels=labels)))
    assert lab.stale() == ["n"]
    for rv, other in enumerate(sorted({"n", "c.1", "r5"} - {shard_key}), start=2):
        lab.observe(node("n", rv, labels={**labels, LABEL: right(other)}))
        assert lab.stale() == ["n"]
    lab.observe(node("n", 9, labels={**labels, LABEL: right(shard_key)}))
    assert lab.stale() == []
