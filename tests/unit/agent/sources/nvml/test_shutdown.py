"""NVML source at stop: nvmlShutdown in the NVML system thread, bounded by a setting."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuhealth.agent.observations import Observation
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.sources.nvml.source import NVML_SHUTDOWN_TIMEOUTS, NvmlSource
from tests.fakes.fake_pynvml import FakeNvml, h100_node
from tests.support.clock import FakeClock
from tests.support.wait import until

CLOCK = FakeClock()
GENEROUS_S = 30.0
"""Only a bound for a broken build (a stop that never returns); never reached when green."""


async def start(fake: FakeNvml, **settings: object) -> tuple[NvmlSource, asyncio.Task[None]]:
    src = NvmlSource(
        NvmlSettings(**{"call_deadline_s": 0.2, "event_wait_ms": 20, **settings}),  # type: ignore[arg-type]
        CLOCK,
        nvml_module=fake,
    )
    got: list[Observation] = []
    task = asyncio.create_task(src.run(got.append))
    await until(lambda: src.polls.count >= 1)
    return src, task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, GENEROUS_S)


async def test_shutdown_runs_in_the_nvml_system_thread() -> None:
    fake = h100_node(2)
    _, task = await start(fake)
    await stop(task)
    assert fake.shutdown_threads == ["nvml-system"]
    assert not fake.initialized
    assert threading.current_thread().name not in fake.shutdown_threads


async def test_a_hung_shutdown_does_not_block_the_stop() -> None:
    fake = h100_node(1)
    fake.shutdown_hang = threading.Event()
    try:
        src, task = await start(fake, shutdown_deadline_s=0.2)
        await stop(task)  # returns although nvmlShutdown never does
        assert fake.shutdown_threads == ["nvml-system"]
        assert src.counters.value(NVML_SHUTDOWN_TIMEOUTS) == 1
    finally:
        fake.shutdown_hang.set()


async def test_a_hung_gpu_call_skips_shutdown_and_does_not_block_the_stop() -> None:
    fake = h100_node(2)
    hang = threading.Event()
    try:
        src, task = await start(fake, shutdown_deadline_s=0.2)
        fake.gpus[1].hang = hang
        n = src.polls.count
        await CLOCK.advance_and_settle(1.0)
        await until(lambda: src.polls.count > n)  # the hung GPU timed out, the loop went on
        await stop(task)
        assert fake.shutdown_threads == []  # never with a call in flight
        assert fake.initialized
    finally:
        hang.set()


async def test_no_shutdown_when_init_failed() -> None:
    fake = h100_node(1)

    def broken() -> None:
        import pynvml

        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = broken  # type: ignore[method-assign]
    src = NvmlSource(NvmlSettings(), FakeClock(), nvml_module=fake)
    with pytest.raises(Exception, match="Driver Not Loaded"):
        await src.run(lambda _: None)
    assert fake.shutdown_threads == []
