"""GPU Operational Events: what they add to the agent, per event and per poll.

* ``op_event_decode_us``: the waiter turning one ``nvmlEventSetWait_v3`` record (pynvml's real
  ``c_nvmlEventSetWait_v3_t``) into an observation, its legacy-Xid context read included (the
  NVML calls themselves answered by a stub at once: NVML's own time is excluded);
* ``op_event_engine_us``: the health engine judging one event (catalog lookup, the one-occurrence
  check against the Xid reports, the verdict), alternating events with and without a legacy Xid;
* ``op_event_poll_overhead_ratio``: CPU time of a simulated poll + evaluation of 8 GPUs where
  every GPU also reports one operational event each poll (far more than a real node sees),
  over the same poll without events, interleaved: the added cost per poll.

The waiter runs in its own thread (``nvmlEventSetWait_v3`` blocks there), so a node without
events pays nothing per poll; these are the costs when events arrive.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pynvml

from bench.registry import Benchmark, Target
from gpuhealth.agent.counters import Counters
from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import GpuIdentity, OperationalEventObservation
from gpuhealth.agent.sources.nvml.gpu import NvmlGpu
from gpuhealth.agent.sources.nvml.operational import NVML_OP_EVENTS, OperationalEventWaiter
from gpuhealth.agent.sources.sim.scenario import Scenario
from gpuhealth.agent.sources.sim.source import SimSource
from tests.support.clock import FakeClock

GPUS = 8
EVENTS = 20_000
POLLS = 1500
WARMUP = 200
REPETITIONS = 5


class _Stub:
    """pynvml's structures and constants; the context calls answer at once."""

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith(("c_nvml", "NVML_")) or name == "NVMLError":
                setattr(self, name, getattr(pynvml, name))

    def nvmlEventSetGetContextCount_v1(self, es: Any, p: Any) -> None:
        p.count = 1

    def nvmlEventSetGetContextInfo_v1(self, es: Any, p: Any) -> None:
        p.nvmlGpuOperationalEventContextType = 1

    def nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1(self, es: Any, p: Any) -> None:
        p.xidCode = 79


def decode_us(n: int = EVENTS) -> float:
    ident = GpuIdentity(index=0, uuid="GPU-0", model="H100", pci_bus_id="00000000:18:00.0")
    gpu = NvmlGpu(0, None, ident, None, None, ())
    waiter = OperationalEventWaiter(
        _Stub(),
        FakeClock(),
        Counters(NVML_OP_EVENTS),
        [gpu],
        wait_ms=500,
    )
    p = pynvml.c_nvmlEventSetWait_v3_t()
    p.dataType, p.uuid, p.sourceModule = 1, b"GPU-0", b"GPU-BUS"
    p.moduleEventCode, p.categoryId, p.severity, p.groupCursor = 3, 3, 40, 7
    t0 = time.thread_time_ns()
    for _ in range(n):
        waiter.observation(None, p)
    return (time.thread_time_ns() - t0) / n / 1000.0


def _events(clock: FakeClock, uuids: list[str], cursor: int) -> list[OperationalEventObservation]:
    return [
        OperationalEventObservation(
            source="nvml",
            at=clock.now(),
            uuid=u,
            module="GPU-RAS",
            code=0x30,
            category=2,
            severity=20,
            group_cursor=cursor * 64 + i,
        )
        for i, u in enumerate(uuids)
    ]


def engine_us(n: int = EVENTS) -> float:
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    sim = SimSource(Scenario(gpus=GPUS), clock, seed=1)
    engine.observe(sim.inventory())
    uuids = [g.uuid for g in sim.inventory().gpus]
    obs = []
    for i in range(n):
        xid = 79 if i % 2 else None
        obs.append(
            OperationalEventObservation(
                source="nvml", at=clock.now(), uuid=uuids[i % GPUS], module="GPU-BUS",
                code=3, category=3, severity=40, legacy_xid=xid, group_cursor=i + 1,
            )
        )  # fmt: skip
    t0 = time.thread_time_ns()
    for o in obs:
        engine.observe(o)
    return (time.thread_time_ns() - t0) / n / 1000.0


def poll_ratio(polls: int = POLLS) -> float:
    """Median CPU per poll with one event per GPU each poll / without, interleaved."""
    return poll_cost(polls)[0]


def poll_cost(polls: int = POLLS) -> tuple[float, float]:
    """(ratio, added CPU microseconds per GPU per poll) of one event per GPU each poll."""
    clock = FakeClock()
    engines = [HealthEngine(HealthSettings(), clock) for _ in range(2)]
    sims = [SimSource(Scenario(gpus=GPUS), clock, seed=1) for _ in range(2)]
    for e, s in zip(engines, sims, strict=True):
        e.observe(s.inventory())
    uuids = [g.uuid for g in sims[0].inventory().gpus]
    base: list[int] = []
    with_events: list[int] = []
    for i in range(WARMUP + polls):
        clock.advance(1.0)
        for k, (e, s) in enumerate(zip(engines, sims, strict=True)):
            events = _events(clock, uuids, i) if k else []
            t0 = time.thread_time_ns()
            s.step(float(i), e.observe)
            for o in events:
                e.observe(o)
            e.tick()
            spent = time.thread_time_ns() - t0
            if i >= WARMUP:
                (with_events if k else base).append(spent)
    b, w = statistics.median(base), statistics.median(with_events)
    return w / b, (w - b) / GPUS / 1000.0


async def _run() -> dict[str, list[float]]:
    costs = [poll_cost() for _ in range(REPETITIONS)]
    return {
        "op_event_decode_us": [decode_us() for _ in range(REPETITIONS)],
        "op_event_engine_us": [engine_us() for _ in range(REPETITIONS)],
        "op_event_poll_overhead_ratio": [c[0] for c in costs],
        "op_event_poll_added_us_per_gpu": [c[1] for c in costs],
    }


BENCHMARKS = [
    Benchmark(
        name="agent_op_events",
        targets=(
            Target("op_event_decode_us", "us", 50.0, "<="),
            Target("op_event_engine_us", "us", 50.0, "<="),
            Target("op_event_poll_overhead_ratio", "x", 1.5, "<="),
            Target("op_event_poll_added_us_per_gpu", "us", 25.0, "<="),
        ),
        run=_run,
        repeats=1,
    )
]

if __name__ == "__main__":
    print(f"op_event_decode_us: {decode_us():.2f}")
    print(f"op_event_engine_us: {engine_us():.2f}")
    ratio, added = poll_cost()
    print(f"op_event_poll_overhead_ratio: {ratio:.3f}, added us per GPU per poll: {added:.2f}")
