"""Cold start of the local control plane (etcd + kube-apiserver until /readyz)."""

from __future__ import annotations

import asyncio

from bench.registry import Benchmark, Target
from localkube import ControlPlane

RUNS = 3


async def _cold_start() -> dict[str, list[float]]:
    def once() -> float:
        with ControlPlane() as cp:
            return cp.startup_seconds

    samples = [await asyncio.to_thread(once) for _ in range(RUNS)]
    return {"controlplane_cold_start_s": samples}


BENCHMARKS = [
    Benchmark(
        name="controlplane_cold_start",
        targets=(Target("controlplane_cold_start_s", "s", 10.0, "<="),),
        run=_cold_start,
        needs_kube=True,
        repeats=1,
    )
]
