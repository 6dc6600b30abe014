"""The controller's stop sequence is bounded as a whole (shutdown_deadline_s)."""

from __future__ import annotations

import asyncio

from gpuhealth.controller.settings import ControllerSettings
from gpuhealth.controller.shutdown import stop_in_order
from tests.support.clock import FakeClock


def _recorder(done: list[str]):  # type: ignore[no-untyped-def]
    def step(name: str):  # type: ignore[no-untyped-def]
        async def run() -> None:
            done.append(name)

        return (name, run)

    return step


async def test_every_step_runs_in_order_within_the_deadline() -> None:
    done: list[str] = []
    step = _recorder(done)
    out = await stop_in_order(
        [step("stream"), step("tasks"), step("parts")], 60.0, always=[step("api")]
    )
    assert done == ["stream", "tasks", "parts", "api"]
    assert out.cut is None and out.skipped == []
    assert set(out.steps) == {"stream", "tasks", "parts", "api"}


async def test_a_hung_step_is_cut_at_the_deadline_the_rest_skipped_and_always_run() -> None:
    done: list[str] = []
    step = _recorder(done)
    never = asyncio.Event()

    async def hung() -> None:
        done.append("parts")
        await never.wait()  # a part that does not stop (e.g. a request without its timeout)

    out = await stop_in_order(
        [step("stream"), ("parts", hung), step("http")],
        0.0,  # the deadline has passed by the first time a step waits
        always=[step("api")],
    )
    assert done == ["stream", "parts", "api"]
    assert out.cut == "parts"
    assert out.skipped == ["http"]
    assert "api" in out.steps


def test_the_default_deadline_is_below_the_pods_default_grace_period() -> None:
    cfg = ControllerSettings()
    assert cfg.shutdown_deadline_s < 30  # the chart's terminationGracePeriodSeconds
    # the steps' own bounds fit inside it: the drain (close_timeout_s, twice) and the parts
    assert 2 * cfg.stream.close_timeout_s + cfg.shutdown_timeout_s < cfg.shutdown_deadline_s


async def test_the_deadline_is_the_injected_clocks() -> None:
    """The whole stop is bounded by the clock it is given: a test moves it, nothing sleeps."""
    clock = FakeClock()
    done: list[str] = []
    step = _recorder(done)
    never = asyncio.Event()

    async def hung() -> None:
        await never.wait()

    stopping = asyncio.create_task(
        stop_in_order([("parts", hung), step("http")], 25.0, always=[step("api")], clock=clock)
    )
    await asyncio.sleep(0)
    clock.advance(24.0)
    await asyncio.sleep(0)
    assert not stopping.done()
    clock.advance(1.0)
    out = await asyncio.wait_for(stopping, 5)
    assert (out.cut, out.skipped, done) == ("parts", ["http"], ["api"])
    assert out.took_s == 25.0
