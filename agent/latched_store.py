"""Latched verdicts (XID, ECC) saved in the state dir, so an agent restart never clears them.

A verdict latches until a GPU reset, a reboot or an operator clear; restarting the agent
(a DaemonSet rollout, an OOM kill) is none of those. The file records the boot id: after a
reboot it is ignored, because a reboot is a recovery.
"""

from __future__ import annotations

from pathlib import Path

from gpuhealth.agent.boot_file import BootScoped, read_boot_file, write_boot_file
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import Condition

log = get_logger("latched")

FILE_NAME = "latched.json"


class LatchedFile(BootScoped, kw_only=True):
    latched: dict[str, list[Condition]] = {}


class LatchedStore:
    def __init__(self, state_dir: str | Path, boot_id: str) -> None:
        self._path = Path(state_dir) / FILE_NAME
        self._boot_id = boot_id
        self._last: dict[str, list[Condition]] | None = None

    def load(self) -> dict[str, list[Condition]]:
        """Verdicts saved on this boot; empty after a reboot or when the file is unreadable."""
        saved, _ = read_boot_file(
            self._path, LatchedFile, self._boot_id, log=log, what="latched_file"
        )
        if saved is None:
            return {}
        self._last = saved.latched
        return saved.latched

    def save(self, latched: dict[str, list[Condition]]) -> None:
        """Write atomically when the latched set changed; an I/O error is logged, not raised."""
        if latched == self._last:
            return
        content = LatchedFile(boot_id=self._boot_id, latched=latched)
        if write_boot_file(self._path, content, log=log, what="latched_file"):
            self._last = latched
