"""The kernel-log follower's settings: the ``kmsg:`` section."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Seconds, SettingError, Settings


class KmsgSettings(Settings, frozen=True, kw_only=True):
    file_poll_interval_s: PositiveSeconds = 0.01
    """A regular file without inotify: the first re-check after lines arrived (tail -F); each
    quiet check doubles the wait, up to ``file_poll_max_s``."""
    file_poll_max_s: PositiveSeconds = 1.0
    """A regular file: the longest wait between two checks of a quiet file (with inotify, the
    re-check that catches a change inotify did not report)."""
    use_inotify: bool = True
    """Wait for a regular file's changes with inotify (Linux); False: poll with backoff."""
    replay: bool = True
    """/dev/kmsg: read the ring buffer's records from the oldest on at start, skipping those an
    earlier run of this boot handled (the position file in the state dir); False: start at the
    end (XIDs logged while the agent was down are lost)."""
    select_timeout_s: PositiveSeconds = 0.5
    """How long one wait on /dev/kmsg or a FIFO lasts before the reader checks for stop."""
    max_line_bytes: Annotated[int, Meta(ge=256, le=1 << 20)] = 8192
    """Longer lines are cut (a /dev/kmsg record is at most 8 KiB)."""
    queue_max: PositiveInt = 10_000
    """Lines waiting for the event loop; beyond this, lines are dropped and counted."""
    file_lookback_s: Seconds = 300.0
    """A followed file with no position of this boot (the first start on a node, the first
    after a reboot): lines dated within this window before start are read back, like
    node-problem-detector's ``lookback`` (undated lines within ``file_lookback_bytes``
    too); a line dated before this boot never is. Later starts resume at the saved position.
    A file that is not the saved one (rotated, recreated, truncated) is read from its start,
    skipping the lines dated more than this before the position was saved: old history in a
    restored or copied log, which the previous run had passed."""
    file_lookback_bytes: Annotated[int, Meta(ge=0, le=1 << 30)] = 1 << 20
    """The most of a followed file read back at a first start, from its end (never the
    whole file); 0: start at the end (lines written before the follower attached are lost).
    Also the end of a new file read beside its head (``file_new_head_bytes``)."""
    file_new_head_bytes: Annotated[int, Meta(ge=1 << 12, le=1 << 30)] = 4 << 20
    """A followed file that is not the saved one is read from its start (its first lines
    follow the saved file's last); when it is larger than this plus ``file_lookback_bytes``,
    only this much of its start (to the end of the line there) and its last
    ``file_lookback_bytes`` are read: the middle is skipped, logged (``kmsg_file_gap``) and
    counted (``kmsg_file_skipped_bytes``). Bounds the work of a start after a long downtime
    or a large log copied into place."""
    file_fingerprint_bytes: Annotated[int, Meta(ge=16, le=1 << 16)] = 1024
    """A followed file's identity beside its device and inode: the hashes of its first bytes
    and of the line before the saved offset cover at most this many bytes each; a restart
    resumes only a file whose content matches (docs/architecture.md "Agent state")."""
    file_position_save_s: PositiveSeconds = 1.0
    """A followed file: the saved offset follows lines that are not XIDs at most this often
    (after an XID line it is saved at once)."""

    def check(self) -> None:
        if self.file_poll_max_s < self.file_poll_interval_s:
            raise SettingError("file_poll_max_s", "must not be below file_poll_interval_s")
