"""Running a node command with a deadline (never on the event loop's thread)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuhealth.common.clock import Clock, SystemClock

OUTPUT_TAIL = 2000
"""Characters of combined output kept for the report."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int | None
    """None: it did not finish within the deadline (it was killed) or could not start."""
    output: str = ""


Runner = Callable[[tuple[str, ...], float], Awaitable[CommandResult]]
"""Runs a command with a deadline (:func:`run_command`, or a stand-in in tests)."""


def available(argv: tuple[str, ...]) -> bool:
    return bool(argv) and shutil.which(argv[0]) is not None


async def run_command(
    argv: tuple[str, ...], timeout_s: float, clock: Clock | None = None
) -> CommandResult:
    """Run ``argv`` (no shell); stdout and stderr together, the tail kept."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        return CommandResult(None, f"cannot run {argv[0]}: {exc}")
    try:
        out, _ = await (clock or SystemClock()).wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return CommandResult(None, f"{argv[0]} did not finish within {timeout_s:g}s")
    text = out.decode("utf-8", "replace")
    return CommandResult(proc.returncode, text[-OUTPUT_TAIL:])
