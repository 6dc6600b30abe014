"""A simulated node reboot for ``source: sim`` (the demo, tests and benchmarks).

A real reboot takes the node down, clears what lives in the GPUs (volatile ECC counts, a
lost or hung GPU, the processes) and brings the agent back with a new kernel boot id. The
simulator does the same in three steps:

1. :class:`SimReboot`, the reboot executor in sim mode (it stands for the reboot command),
   writes ``sim-boot.json`` in the agent's state directory: a new boot id and how far into
   the scenario the node was, then asks the agent to restart.
2. The agent stops cleanly and starts again in a fresh process (``agent/cli.py`` re-executes
   itself), reading the boot id from that file (:func:`sim_boot_id`).
3. The new :class:`~gpuhealth.agent.sources.sim.source.SimSource` resumes the scenario where it was
   (:func:`resume_at`): the faults already played leave only what survives a reboot (the
   aggregate ECC counts, a failed row remap), later faults still come.

Without the file (no simulated reboot yet) the agent uses the kernel's boot id.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec

from gpuhealth.agent.remediation.order_results import Outcome
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import RebootOrder

log = get_logger("agent.sim.reboot")

FILE_NAME = "sim-boot.json"


class SimBootFile(msgspec.Struct, frozen=True):
    boot_id: str
    resume_at_s: float
    """Seconds into the scenario when the simulated node went down."""


def _path(state_dir: str | Path) -> Path:
    return Path(state_dir) / FILE_NAME


def _read(state_dir: str | Path) -> SimBootFile | None:
    try:
        return msgspec.json.decode(_path(state_dir).read_bytes(), type=SimBootFile)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("sim_boot_file_unreadable", path=str(_path(state_dir)), error=str(exc))
        return None


def sim_boot_id(state_dir: str | Path) -> str | None:
    """The simulated node's boot id after its last simulated reboot (None: never rebooted)."""
    saved = _read(state_dir)
    return saved.boot_id if saved is not None else None


def resume_at(state_dir: str | Path) -> float:
    """Where the scenario resumes after a simulated reboot (0: from the start)."""
    saved = _read(state_dir)
    return saved.resume_at_s if saved is not None else 0.0


def write_reboot(state_dir: str | Path, resume_at_s: float) -> str:
    """Record a simulated reboot (atomically, fsync'd); returns the new boot id."""
    boot_id = str(uuid.uuid4())
    path = _path(state_dir)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode(SimBootFile(boot_id, resume_at_s)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return boot_id


class SimReboot:
    """The reboot executor with simulated GPUs: records the reboot, then restarts the agent
    (``restart``: stop cleanly and start again in a new process)."""

    def __init__(self, sim: SimSource, state_dir: str | Path, restart: Callable[[], None]) -> None:
        self._sim = sim
        self._state_dir = state_dir
        self._restart = restart

    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        try:
            new = write_reboot(self._state_dir, self._sim.elapsed())
        except OSError as exc:
            return Outcome("failed", "command-failed", f"simulated reboot: {exc}")
        log.warning("sim_node_rebooting", node=node, boot_id=boot_id, new_boot_id=new)
        asyncio.get_running_loop().call_soon(self._restart)  # after the order is journaled
        return Outcome("succeeded", message="node rebooting (simulated)")
