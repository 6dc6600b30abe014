"""Latched verdicts (XID, ECC) saved in the state dir, so an agent restart never clears them.

A verdict latches until a GPU reset, a reboot or an operator clear; restarting the agent
(a DaemonSet rollout, an OOM kill) is none of those. The file records the boot id: after a
reboot it is ignored, because a reboot is a recovery.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import Condition

log = get_logger("latched")

FILE_NAME = "latched.json"


class LatchedFile(msgspec.Struct, kw_only=True):
    boot_id: str
    latched: dict[str, list[Condition]] = {}


class LatchedStore:
    def __init__(self, state_dir: str | Path, boot_id: str) -> None:
        self._path = Path(state_dir) / FILE_NAME
        self._boot_id = boot_id
        self._last: dict[str, list[Condition]] | None = None

    def load(self) -> dict[str, list[Condition]]:
        """Verdicts saved on this boot; empty after a reboot or when the file is unreadable."""
        try:
            saved = msgspec.json.decode(self._path.read_bytes(), type=LatchedFile)
        except FileNotFoundError:
            return {}
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("latched_file_unreadable", path=str(self._path), error=str(exc))
            return {}
        if saved.boot_id != self._boot_id:
            log.info("latched_file_from_previous_boot", path=str(self._path))
            return {}
        self._last = saved.latched
        return saved.latched

    def save(self, latched: dict[str, list[Condition]]) -> None:
        """Write atomically when the latched set changed; an I/O error is logged, not raised."""
        if latched == self._last:
            return
        data = msgspec.json.encode(LatchedFile(boot_id=self._boot_id, latched=latched))
        tmp = self._path.with_suffix(".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("latched_file_not_saved", path=str(self._path), error=str(exc))
            return
        self._last = latched
