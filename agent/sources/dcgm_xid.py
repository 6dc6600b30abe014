"""Which ``DCGM_FI_DEV_XID_ERRORS`` values are new XIDs: a baseline kept across restarts.

The field holds the *last* XID DCGM saw on a GPU, for as long as DCGM runs (days, often),
so its value alone says nothing new. An XID is new when the value changes. The value last
seen per GPU is saved in the state dir (``dcgm-xid.json``, with the boot id), so a restart
of the agent neither reports the old value again nor misses an XID that arrived meanwhile:

- a GPU known from this run, or from the file of this boot: a changed, non-zero value is a
  new XID;
- a GPU unknown on this boot (no file, an unreadable file, a GPU first seen): its first
  value is the baseline and is not reported (it may be days old);
- a file from an earlier boot: DCGM started after that reboot, so any XID it holds happened
  on this boot and is reported once.

A key is a GPU's UUID, or ``<uuid>/gi<N>`` for a MIG GPU instance's own series.
Repeats of the same code between two scrapes are invisible here; the kernel log sees them.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

import msgspec

from gpuhealth.common.logging import get_logger

log = get_logger("dcgm")

FILE_NAME = "dcgm-xid.json"


class XidVerdict(Enum):
    NEW = "new"
    """A new XID: report it."""
    SAME = "same"
    """The value already seen (or none yet)."""
    BASELINE = "baseline"
    """First value of a GPU with no history: not reported."""


class XidFile(msgspec.Struct, kw_only=True):
    boot_id: str
    last: dict[str, int] = {}


class XidBaseline:
    def __init__(self, state_dir: str | Path | None, boot_id: str) -> None:
        self._path = Path(state_dir) / FILE_NAME if state_dir is not None else None
        self._boot_id = boot_id
        self._last: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        self._after_reboot = False
        self._load()

    def _load(self) -> None:
        if self._path is None:
            return
        try:
            saved = msgspec.json.decode(self._path.read_bytes(), type=XidFile)
        except FileNotFoundError:
            return
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("dcgm_xid_file_unreadable", path=str(self._path), error=str(exc))
            return
        if saved.boot_id != self._boot_id:
            log.info("dcgm_xid_file_from_previous_boot", path=str(self._path))
            self._after_reboot = True
            return
        self._last = dict(saved.last)
        self._saved = dict(saved.last)

    def judge(self, uuid: str, code: int) -> XidVerdict:
        """What the GPU's current field value means; remembers it."""
        prev = self._last.get(uuid)
        self._last[uuid] = code
        if prev is None:
            if self._after_reboot and code:
                return XidVerdict.NEW
            return XidVerdict.BASELINE if code else XidVerdict.SAME
        return XidVerdict.NEW if code and code != prev else XidVerdict.SAME

    def save(self) -> None:
        """Write atomically when a value changed; an I/O error is logged, not raised."""
        if self._path is None or self._last == self._saved:
            return
        data = msgspec.json.encode(XidFile(boot_id=self._boot_id, last=self._last))
        tmp = self._path.with_suffix(".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("dcgm_xid_file_not_saved", path=str(self._path), error=str(exc))
            return
        self._saved = dict(self._last)
