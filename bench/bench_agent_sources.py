"""Agent poll path: CPU time of one simulated poll plus health evaluation, per GPU.

The simulator stands in for NVML (whose own call time is excluded): this measures what the
agent itself spends per GPU per poll: building the sample and running every health rule.
"""

from __future__ import annotations

import statistics
import time

from bench.registry import Benchmark, Target
from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.sources.sim.scenario import Scenario
from gpuhealth.agent.sources.sim.source import SimSource
from tests.support.clock import FakeClock

GPUS = 8
WARMUP_POLLS = 200
POLLS = 3000
REPETITIONS = 5


def measure(polls: int = POLLS, gpus: int = GPUS) -> float:
    """Median CPU microseconds per GPU of one poll + evaluation."""
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    sim = SimSource(Scenario(gpus=gpus), clock, seed=1)
    engine.observe(sim.inventory())
    sink = engine.observe
    per_poll: list[int] = []
    for i in range(WARMUP_POLLS + polls):
        clock.advance(1.0)
        t0 = time.thread_time_ns()
        sim.step(float(i), sink)
        engine.tick()
        spent = time.thread_time_ns() - t0
        if i >= WARMUP_POLLS:
            per_poll.append(spent)
    return statistics.median(per_poll) / 1000.0 / gpus


async def _run() -> dict[str, list[float]]:
    return {"agent_poll_cpu_us_per_gpu": [measure() for _ in range(REPETITIONS)]}


BENCHMARKS = [
    Benchmark(
        name="agent_sources",
        targets=(Target("agent_poll_cpu_us_per_gpu", "us", 50.0, "<="),),
        run=_run,
        repeats=1,
    )
]

if __name__ == "__main__":
    print(f"agent_poll_cpu_us_per_gpu: {measure():.2f}")
