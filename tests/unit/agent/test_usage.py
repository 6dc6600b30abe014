"""Per-allocation utilisation and its attribution (process versus whole GPU)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.cgroup import CgroupOwner
from gpuhealth.agent.observations import GpuSample
from gpuhealth.agent.usage import (
    ContainerRef,
    UsageAccumulator,
    allocation_usage,
    containers_by_id,
    host_resolver,
    parse_container_log_name,
    resolve_pids,
)
from gpuhealth.protocol import Allocation, AllocationUsage

T = datetime(2026, 11, 22, 10, tzinfo=UTC)
CID_A = "a" * 64
CID_B = "b" * 64
A = ContainerRef("team-a", "train-0", "main")
B = ContainerRef("team-b", "notebook", "jupyter")


def alloc(ref: ContainerRef, gpu: str, replica: int | None = None) -> Allocation:
    device = gpu if replica is None else f"{gpu}::{replica}"
    return Allocation(
        namespace=ref.namespace,
        pod=ref.pod,
        container=ref.container,
        gpu_uuid=gpu,
        device_id=device,
    )


def sample(gpu: str, util: float | None, procs: dict[int, float] | None = None) -> GpuSample:
    return GpuSample(uuid=gpu, at=T, utilization_ratio=util, process_utilization=procs or {})


def as_table(usage: list[AllocationUsage]) -> dict[tuple[str, str], tuple[float, str, int]]:
    return {
        (u.pod, u.gpu_uuid): (round(u.utilization_ratio, 3), u.attribution, u.samples)
        for u in usage
    }


OWNERS = {100: A, 101: A, 200: B}


@pytest.mark.parametrize(
    ("name", "allocs", "samples", "want"),
    [
        (
            "exclusive GPU, no per-process data",
            [alloc(A, "GPU-0")],
            [sample("GPU-0", 0.4), sample("GPU-0", 0.6)],
            {("train-0", "GPU-0"): (0.5, "gpu", 2)},
        ),
        (
            "time-sliced GPU with per-process data",
            [alloc(A, "GPU-0", 0), alloc(B, "GPU-0", 1)],
            [sample("GPU-0", 0.9, {100: 0.5, 101: 0.3, 200: 0.01})],
            {
                ("train-0", "GPU-0"): (0.8, "process", 1),
                ("notebook", "GPU-0"): (0.01, "process", 1),
            },
        ),
        (
            "shared GPU, holder without processes gets zero",
            [alloc(A, "GPU-0", 0), alloc(B, "GPU-0", 1)],
            [sample("GPU-0", 0.9, {100: 0.9})],
            {
                ("train-0", "GPU-0"): (0.9, "process", 1),
                ("notebook", "GPU-0"): (0.0, "process", 1),
            },
        ),
        (
            "shared GPU, processes unresolved: whole GPU to everyone",
            [alloc(A, "GPU-0", 0), alloc(B, "GPU-0", 1)],
            [sample("GPU-0", 0.7, {999: 0.7})],
            {("train-0", "GPU-0"): (0.7, "gpu", 1), ("notebook", "GPU-0"): (0.7, "gpu", 1)},
        ),
        (
            "mixed samples report the weaker attribution",
            [alloc(A, "GPU-0")],
            [sample("GPU-0", 0.2, {100: 0.2}), sample("GPU-0", 0.4)],
            {("train-0", "GPU-0"): (0.3, "gpu", 2)},
        ),
        (
            "no figure at all: nothing (unknown is not idle)",
            [alloc(A, "GPU-0")],
            [sample("GPU-0", None)],
            {},
        ),
        (
            "GPU without allocation is ignored",
            [alloc(A, "GPU-0")],
            [sample("GPU-1", 0.9), sample("GPU-0", 0.0)],
            {("train-0", "GPU-0"): (0.0, "gpu", 1)},
        ),
        (
            "two replicas in one container count once; sums are clamped",
            [alloc(A, "GPU-0", 0), alloc(A, "GPU-0", 1)],
            [sample("GPU-0", 1.0, {100: 0.8, 101: 0.7})],
            {("train-0", "GPU-0"): (1.0, "process", 1)},
        ),
        (
            "non-finite figures are dropped",
            [alloc(A, "GPU-0")],
            [sample("GPU-0", float("nan")), sample("GPU-0", 0.2)],
            {("train-0", "GPU-0"): (0.2, "gpu", 1)},
        ),
    ],
)
def test_allocation_usage(
    name: str,
    allocs: list[Allocation],
    samples: list[GpuSample],
    want: dict[tuple[str, str], tuple[float, str, int]],
) -> None:
    assert as_table(allocation_usage(allocs, samples, OWNERS)) == want, name


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GPU-0", "GPU-1"]),
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
            st.dictionaries(st.sampled_from([100, 101, 200, 300]), st.floats(-1, 5), max_size=4),
        ),
        max_size=6,
    )
)
def test_usage_is_always_a_valid_ratio(
    raw: list[tuple[str, float | None, dict[int, float]]],
) -> None:
    allocs = [alloc(A, "GPU-0", 0), alloc(B, "GPU-0", 1), alloc(B, "GPU-1")]
    for u in allocation_usage(allocs, [sample(g, x, p) for g, x, p in raw], OWNERS):
        assert 0.0 <= u.utilization_ratio <= 1.0
        assert u.samples >= 1


def test_container_log_names() -> None:
    name = f"train-0_team-a_main-{CID_A}.log"
    assert parse_container_log_name(name) == (CID_A, A)
    assert parse_container_log_name("not-a-log.txt") is None
    assert parse_container_log_name(f"train-0_team-a_main-{CID_A[:10]}.log") is None
    found = containers_by_id([name, f"notebook_team-b_jupyter-{CID_B}.log", "junk"])
    assert found == {CID_A: A, CID_B: B}


def test_resolve_pids_through_cgroup_and_log_index() -> None:
    owners = {
        1: CgroupOwner("u1", CID_A),
        2: CgroupOwner("u2", CID_B),
        3: CgroupOwner("u3", None),
        4: CgroupOwner("u4", "c" * 64),
    }
    got = resolve_pids([1, 2, 3, 4, 5], owners.get, {CID_A: A, CID_B: B})
    assert got == {1: A, 2: B}


def test_accumulator_drains_per_heartbeat_with_resolver(tmp_path: Path) -> None:
    (tmp_path / "proc" / "100").mkdir(parents=True)
    (tmp_path / "proc" / "100" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{'1' * 8}_{'2' * 4}_{'3' * 4}_{'4' * 4}_{'5' * 12}.slice/"
        f"cri-containerd-{CID_A}.scope\n"
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"train-0_team-a_main-{CID_A}.log").touch()
    acc = UsageAccumulator(host_resolver(tmp_path / "proc", tmp_path / "logs"), 3)
    allocs = [alloc(A, "GPU-0", 0), alloc(B, "GPU-0", 1)]
    for _ in range(5):  # only the last 3 are kept
        acc.record(sample("GPU-0", 0.5, {100: 0.5}))
    table = as_table(acc.drain(allocs))
    assert table == {
        ("train-0", "GPU-0"): (0.5, "process", 3),
        ("notebook", "GPU-0"): (0.0, "process", 3),
    }
    assert acc.drain(allocs) == []  # drained
    plain = UsageAccumulator()
    plain.record(sample("GPU-0", 0.5, {100: 0.5}))
    assert as_table(plain.drain(allocs))[("notebook", "GPU-0")] == (0.5, "gpu", 1)
