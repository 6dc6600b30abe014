"""What an executor answers: the report's state, a short reason code, details."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuhealth.protocol.remediation import CheckResult, GpuProcess

State = Literal["accepted", "running", "succeeded", "failed", "refused"]


@dataclass(frozen=True, slots=True)
class Outcome:
    state: State
    reason: str = ""
    """A short code (``gpu-busy``, ``unknown-gpu``, ``boot-id-changed`` ...)."""
    message: str = ""
    processes: tuple[GpuProcess, ...] = ()
    checks: tuple[CheckResult, ...] = field(default=())
