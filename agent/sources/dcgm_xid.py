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

from enum import Enum
from pathlib import Path

from gpuhealth.agent.boot_file import BootScoped, read_boot_file, write_boot_file
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


class XidFile(BootScoped, kw_only=True):
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
        saved, self._after_reboot = read_boot_file(
            self._path, XidFile, self._boot_id, log=log, what="dcgm_xid_file"
        )
        if saved is None:
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
        content = XidFile(boot_id=self._boot_id, last=self._last)
        if write_boot_file(self._path, content, log=log, what="dcgm_xid_file"):
            self._saved = dict(self._last)
