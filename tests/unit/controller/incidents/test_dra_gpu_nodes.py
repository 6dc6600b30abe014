"""GPU nodes known by their DRA ResourceSlices alone (NVIDIA's GPU DRA driver,
``gpu.nvidia.com``: its ResourceSlice per node and pool, one device per GPU or MIG device)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.incidents.dra_gpu_nodes import dra_gpu_nodes
from tests.support.clock import FakeClock
from tests.unit.controller.incidents.test_unwatched import View, Views, watch_of


def slice_of(node: str | None, driver: str = "gpu.nvidia.com", devices: int = 8) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": node or "shared", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


@pytest.mark.parametrize(
    ("slices", "want"),
    [
        ([slice_of("a")], {"a": 8}),
        ([slice_of("a", devices=4), slice_of("a", devices=4)], {"a": 8}),  # two pools
        ([slice_of("a", driver="compute-domain.nvidia.com")], {}),  # not a GPU
        ([slice_of("a", driver="gpu.intel.com")], {}),
        ([slice_of(None)], {}),  # a network-attached pool: no node
        ([{"spec": "bad"}, {"no": "spec"}, {"spec": {"driver": "gpu.nvidia.com"}}], {}),
        ([slice_of("a"), slice_of("b", devices=0)], {"a": 8, "b": 0}),
    ],
)
def test_dra_gpu_nodes(slices: list[dict[str, Any]], want: dict[str, int]) -> None:
    assert dra_gpu_nodes(slices, ["gpu.nvidia.com"]) == want


def test_a_dra_only_node_without_an_agent_is_unwatched() -> None:
    """No GFD label, no nvidia.com/gpu capacity: its ResourceSlices say it has GPUs."""
    clock = FakeClock()
    dra: dict[str, int] = {}
    fleet = Fleet(FleetSettings(), clock)
    watch = watch_of(fleet, Views(View("dra-only"), View("cpu")), clock, dra_nodes=lambda: dra)
    assert watch.check() == []
    clock.advance(600)
    assert watch.check() == []  # not known as a GPU node yet
    dra.update(dra_gpu_nodes([slice_of("dra-only", devices=4)], ["gpu.nvidia.com"]))
    assert watch.check() == ["dra-only"]
    [inc] = watch.book.list()
    assert inc.key == "dra-only" and inc.evidence["gpus"] == 4
