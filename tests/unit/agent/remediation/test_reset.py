"""GPU reset: refused while any process uses the GPU, NVML off the event loop, the
command only after the checks, the GPU must answer NVML afterwards."""

from __future__ import annotations

import threading

import pytest

from gpuhealth.agent.remediation.command import CommandResult
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe
from gpuhealth.agent.remediation.reset import GpuResetter
from gpuhealth.agent.remediation.settings import ResetCommandSettings
from tests.fakes.fake_pynvml_processes import FakeNvmlProcesses, node_with_processes


class Commands:
    def __init__(self, returncode: int = 0, output: str = "") -> None:
        self.calls: list[tuple[str, ...]] = []
        self.result = CommandResult(returncode, output)

    async def __call__(self, argv: tuple[str, ...], timeout_s: float) -> CommandResult:
        self.calls.append(argv)
        return self.result


def resetter(
    nvml: FakeNvmlProcesses, run: Commands, on_reset: list[str] | None = None
) -> GpuResetter:
    return GpuResetter(
        NvmlProbe(nvml, timeout_s=1.0),
        ResetCommandSettings(),
        on_reset=(on_reset.append if on_reset is not None else lambda _u: None),
        run=run,
    )


async def test_idle_gpu_is_reset_and_the_engine_told() -> None:
    nvml = node_with_processes(4)
    run, done = Commands(), []
    out = await resetter(nvml, run, done).reset([nvml.gpus[2].uuid])
    assert out.state == "succeeded"
    assert run.calls == [("nvidia-smi", "--gpu-reset", "-i", nvml.gpus[2].uuid)]
    assert done == [nvml.gpus[2].uuid]
    assert nvml.init_calls >= 1 and not nvml.initialized  # every init has its shutdown


@pytest.mark.parametrize("table", ["processes", "graphics"])
async def test_busy_gpu_is_refused_with_the_pids(table: str) -> None:
    nvml = node_with_processes(4)
    getattr(nvml, table)[1] = [4242, 77]
    run = Commands()
    out = await resetter(nvml, run).reset([nvml.gpus[1].uuid])
    assert (out.state, out.reason) == ("refused", "gpu-busy")
    assert [p.pid for p in out.processes] == [77, 4242]
    assert "4242" in out.message
    assert run.calls == []  # nothing was reset


async def test_unknown_gpu_and_mig_are_refused() -> None:
    nvml = node_with_processes(2)
    run = Commands()
    out = await resetter(nvml, run).reset(["GPU-not-here"])
    assert (out.state, out.reason) == ("refused", "unknown-gpu")
    nvml.gpus[0].mig_mode = 1
    out = await resetter(nvml, run).reset([nvml.gpus[0].uuid])
    assert (out.state, out.reason) == ("refused", "mig-enabled")
    assert run.calls == []


async def test_hung_nvml_is_refused_not_waited_on() -> None:
    nvml = node_with_processes(2)
    nvml.gpus[0].hang = threading.Event()
    run = Commands()
    try:
        r = GpuResetter(NvmlProbe(nvml, timeout_s=0.2), ResetCommandSettings(), run=run)
        out = await r.reset([nvml.gpus[0].uuid])
    finally:
        nvml.gpus[0].hang.set()
    assert (out.state, out.reason) == ("refused", "nvml-unavailable")
    assert run.calls == []


async def test_failed_command_and_a_gpu_that_does_not_come_back() -> None:
    nvml = node_with_processes(2)
    out = await resetter(nvml, Commands(3, "Unable to reset GPU")).reset([nvml.gpus[0].uuid])
    assert (out.state, out.reason) == (
        "failed",
        "command-failed",
    ) and "Unable to reset" in out.message

    class LosesGpu(Commands):
        async def __call__(self, argv: tuple[str, ...], timeout_s: float) -> CommandResult:
            nvml.gpus[1].lost = True
            return await super().__call__(argv, timeout_s)

    out = await resetter(nvml, LosesGpu()).reset([nvml.gpus[1].uuid])
    assert (out.state, out.reason) == ("failed", "gpu-not-back")


@pytest.mark.parametrize(
    "name",
    [
        "MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f",  # NVML resolves MIG UUIDs to a MIG handle
        "MIG-GPU-00000000-1111-2222-3333-444444444444/1/0",
        "0",  # an index: nvidia-smi -i takes one, NVML's UUID lookup does not
        "-r",
    ],
)
async def test_an_order_naming_anything_but_a_whole_gpu_is_refused(name: str) -> None:
    nvml = node_with_processes(2)
    run = Commands()
    out = await resetter(nvml, run).reset([nvml.gpus[0].uuid, name])
    assert (out.state, out.reason) == ("refused", "unknown-gpu")
    assert name in out.message
    assert run.calls == []  # not even the GPU listed first


async def test_a_gpu_named_twice_is_reset_once() -> None:
    nvml = node_with_processes(2)
    run, done = Commands(), []
    uuid = nvml.gpus[1].uuid
    out = await resetter(nvml, run, done).reset([uuid, uuid, uuid])
    assert out.state == "succeeded"
    assert run.calls == [("nvidia-smi", "--gpu-reset", "-i", uuid)]
    assert done == [uuid]
