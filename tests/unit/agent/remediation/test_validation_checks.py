"""Agent-side validation: NVML, the verdict's signals, a clean soak window, the hook."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gpuhealth.agent.remediation.command import CommandResult
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe
from gpuhealth.agent.remediation.order_results import Outcome
from gpuhealth.agent.remediation.settings import ValidationCheckSettings
from gpuhealth.agent.remediation.validation_checks import Validator
from gpuhealth.protocol import Condition, GpuInfo, GpuStatus
from gpuhealth.protocol.remediation import ValidateOrder
from tests.fakes.fake_pynvml_processes import node_with_processes
from tests.support.clock import FakeClock
from tests.support.wait import until

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
XID48 = Condition(reason="XidError", code="xid-48", severity="unhealthy", action="RESET_GPU")


def order(uuids: list[str], soak_s: float = 60, diagnostic: bool = False) -> ValidateOrder:
    return ValidateOrder(
        seq=1,
        order_id="abc-validate-1",
        episode="e",
        issued_at=AT,
        deadline_s=600,
        gpus=uuids,
        signals=["xid-48"],
        soak_s=soak_s,
        diagnostic=diagnostic,
    )


class Board:
    """The agent's GPU statuses, changeable during the soak."""

    def __init__(self, uuids: list[str]) -> None:
        self.statuses = [
            GpuStatus(info=GpuInfo(index=i, uuid=u), state="healthy") for i, u in enumerate(uuids)
        ]

    def __call__(self) -> list[GpuStatus]:
        return list(self.statuses)


async def soak(
    v: Validator,
    o: ValidateOrder,
    clock: FakeClock,
    *,
    relapse_at: float | None = None,
    board: Board | None = None,
) -> Outcome:
    seen: list[Outcome] = []
    task = asyncio.create_task(v.validate(o, seen.append))
    # the NVML checks run in worker threads (real time): the soak starts after them
    await until(lambda: seen or task.done(), "the soak to start")
    t = 0.0
    while not task.done():
        await clock.advance_and_settle(5)
        t += 5
        if relapse_at is not None and board is not None and t >= relapse_at:
            board.statuses[0] = GpuStatus(
                info=board.statuses[0].info, state="unhealthy", conditions=[XID48]
            )
        if t > 10_000:
            raise AssertionError("validation never finished")
    assert seen and seen[0].state == "running"
    return task.result()


def validator(nvml, board, clock, *, run=None, installed=lambda argv: False):  # type: ignore[no-untyped-def]
    async def no_run(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
        raise AssertionError("no command expected")

    return Validator(
        NvmlProbe(nvml, 1.0),
        board,
        ValidationCheckSettings(check_interval_s=5),
        clock,
        run=run or no_run,
        installed=installed,
    )


async def test_clean_soak_passes() -> None:
    nvml, clock = node_with_processes(2), FakeClock()
    uuids = [g.uuid for g in nvml.gpus]
    out = await soak(validator(nvml, Board(uuids), clock), order(uuids), clock)
    assert out.state == "succeeded"
    assert [c.name for c in out.checks][-2:] == ["signals", "soak"] and all(
        c.passed for c in out.checks
    )


async def test_relapse_during_the_soak_fails() -> None:
    nvml, clock = node_with_processes(2), FakeClock()
    uuids = [g.uuid for g in nvml.gpus]
    board = Board(uuids)
    out = await soak(validator(nvml, board, clock), order(uuids), clock, relapse_at=30, board=board)
    assert (out.state, out.reason) == ("failed", "validation-failed")
    assert "relapse" in out.message and not out.checks[-1].passed


async def test_signal_still_present_fails_at_once() -> None:
    nvml, clock = node_with_processes(1), FakeClock()
    uuids = [nvml.gpus[0].uuid]
    board = Board(uuids)
    board.statuses[0] = GpuStatus(info=board.statuses[0].info, state="healthy", conditions=[XID48])
    out = await validator(nvml, board, clock).validate(order(uuids), lambda _o: None)
    assert out.state == "failed" and "still reports xid-48" in out.message + str(
        [c.message for c in out.checks]
    )


async def test_unreachable_gpu_fails() -> None:
    nvml, clock = node_with_processes(2), FakeClock()
    uuids = [g.uuid for g in nvml.gpus]
    nvml.gpus[1].lost = True
    out = await validator(nvml, Board(uuids), clock).validate(order(uuids), lambda _o: None)
    assert out.state == "failed"
    assert [c.passed for c in out.checks if c.name.startswith("nvml:")] == [True, False]


async def test_diagnostic_hook_runs_when_installed_and_could_not_run_fails_otherwise() -> None:
    nvml, clock = node_with_processes(1), FakeClock()
    uuids = [nvml.gpus[0].uuid]
    calls: list[tuple[str, ...]] = []

    async def dcgmi(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
        calls.append(argv)
        return CommandResult(1, "Diagnostic: Fail")

    out = await soak(
        validator(nvml, Board(uuids), clock, run=dcgmi, installed=lambda a: True),
        order(uuids, soak_s=0, diagnostic=True),
        clock,
    )
    assert (out.state, out.reason) == ("failed", "diagnostic-failed") and calls == [
        ("dcgmi", "diag", "-r", "1")
    ]
    out = await soak(
        validator(nvml, Board(uuids), clock, installed=lambda a: False),
        order(uuids, soak_s=0, diagnostic=True),
        clock,
    )  # asked for and not installed: could not run, never a pass
    assert (out.state, out.reason) == ("failed", "diagnostic-unavailable")
    assert not out.checks[-1].passed and "dcgmi is not installed" in out.checks[-1].message
