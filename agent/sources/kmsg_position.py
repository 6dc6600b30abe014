"""Where the kernel-log follower got to in /dev/kmsg, kept in the state dir per boot.

/dev/kmsg numbers its records (``prio,SEQ,usec,flags;message``) from 0 at boot. The follower
reads the ring buffer from its oldest record at start, so XIDs logged while the agent was down
or restarting are seen; records up to the saved sequence number of the same boot were handled
by an earlier run and are skipped. A file from an earlier boot (or none) means: replay every
record of this boot.

The file (``kmsg-position.json``) is replaced atomically (write, rename). It is not fsync'd: a
power loss or a kernel crash is a new boot, whose records this file never describes.
"""

from __future__ import annotations

from pathlib import Path

from gpuhealth.agent.boot_file import BootScoped, read_boot_file, write_boot_file
from gpuhealth.common.logging import get_logger

log = get_logger("kmsg")

FILE_NAME = "kmsg-position.json"


class PositionFile(BootScoped, kw_only=True):
    seq: int


class KmsgPosition:
    """The last handled /dev/kmsg sequence number of this boot."""

    def __init__(self, state_dir: str | Path, boot_id: str) -> None:
        self._path = Path(state_dir) / FILE_NAME
        self._boot_id = boot_id
        self._saved: int | None = None

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> int | None:
        """The sequence number handled last on this boot; None: replay every record."""
        saved, _ = read_boot_file(
            self._path, PositionFile, self._boot_id, log=log, what="kmsg_position"
        )
        if saved is None:
            return None
        self._saved = saved.seq
        return saved.seq

    def save(self, seq: int) -> None:
        """Record ``seq`` as handled (only forward); an I/O error is logged, not raised: the
        worst case is that a restart reports those XIDs again."""
        if self._saved is not None and seq <= self._saved:
            return
        content = PositionFile(boot_id=self._boot_id, seq=seq)
        if write_boot_file(self._path, content, log=log, what="kmsg_position"):
            self._saved = seq
