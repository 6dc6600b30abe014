"""Which ``DCGM_FI_DEV_XID_ERRORS`` values are new XIDs: a baseline kept across restarts.

The field holds the *last* XID DCGM saw on a GPU, for as long as DCGM runs (days, often),
so its value alone says nothing new. An XID is new when the value changes. The value last
seen per GPU is saved in the agent's state store (``dcgm_xid``, per boot), so a restart
of the agent neither reports the old value again nor misses an XID that arrived meanwhile:

- a GPU known from this run, or saved on this boot: a changed, non-zero value is a
  new XID;
- a GPU unknown on this boot (nothing saved, unreadable, a GPU first seen): its first
  value is the baseline and is not reported (it may be days old);
- a baseline saved on an earlier boot: DCGM started after that reboot, so any XID it holds happened
  on this boot and is reported once.

A key is a GPU's UUID, or ``<uuid>/gi<N>`` for a MIG GPU instance's own series.
Repeats of the same code between two scrapes are invisible here; the kernel log sees them.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import msgspec

from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.logging import get_logger

log = get_logger("dcgm")

NAME = "dcgm_xid"


class XidChange(Enum):
    NEW = "new"
    """A new XID: report it."""
    SAME = "same"
    """The value already seen (or none yet)."""
    BASELINE = "baseline"
    """First value of a GPU with no history: not reported."""


class XidBaseline:
    def __init__(self, store: StateStore | str | Path | None, boot_id: str) -> None:
        """``store``: None keeps the baseline in memory only."""
        self._store = StateStore.of(store) if store is not None else None
        self._boot_id = boot_id
        self._last: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        self._after_reboot = False
        self._load()

    def _load(self) -> None:
        if self._store is None:
            return
        raw, self._after_reboot = self._store.boot_value(NAME, self._boot_id)
        if raw is None:
            return
        try:
            saved = msgspec.json.decode(raw, type=dict[str, int])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("dcgm_xid_baseline_unreadable", error=str(exc))
            return
        self._last = dict(saved)
        self._saved = dict(saved)

    def judge(self, uuid: str, code: int) -> XidChange:
        """What the GPU's current field value means; remembers it."""
        prev = self._last.get(uuid)
        self._last[uuid] = code
        if prev is None:
            if self._after_reboot and code:
                return XidChange.NEW
            return XidChange.BASELINE if code else XidChange.SAME
        return XidChange.NEW if code and code != prev else XidChange.SAME

    def save(self) -> None:
        """Write when a value changed; an I/O error is logged, not raised."""
        if self._store is None or self._last == self._saved:
            return
        if self._store.put_boot_value(NAME, self._boot_id, msgspec.json.encode(self._last)):
            self._saved = dict(self._last)
