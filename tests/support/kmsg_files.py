"""Followed kernel-log files in tests: the position a run of the follower saves after a line,
with its fingerprint computed the way the reader thread computes it (``LinePrints``), a file
created anew with its old inode number (observed, or forced in the saved position), and the
position a running agent last wrote."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import msgspec

from gpuhealth.agent.sources.kmsg.file_start import FileMark, Fingerprint, LinePrints
from gpuhealth.agent.sources.kmsg.libc import birth_time
from gpuhealth.agent.sources.kmsg.source import NAME, PositionFile
from gpuhealth.agent.state_store import DB_NAME, StateStore

FINGERPRINT_BYTES = 1024
"""``kmsg.file_fingerprint_bytes``'s default."""


def prints_of(data: bytes, limit: int = FINGERPRINT_BYTES) -> dict[int, Fingerprint]:
    """The fingerprint after each line of ``data`` (read from its start), by end offset."""
    out: dict[int, Fingerprint] = {}
    prints = LinePrints(b"", 0, limit)
    end = 0
    for line in data.splitlines(keepends=True):
        end += len(line)
        out[end] = prints.line(line, end)
    return out


def mark_at(log: Path, offset: int, limit: int = FINGERPRINT_BYTES) -> FileMark:
    """The position a run saves after the line of ``log`` that ends at ``offset``."""
    fd = os.open(log, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        born = birth_time(fd)
    finally:
        os.close(fd)
    fingerprint = prints_of(log.read_bytes()[:offset], limit)[offset]
    return FileMark(
        path=str(log), dev=st.st_dev, ino=st.st_ino, offset=offset, born=born,
        fingerprint=fingerprint,
    )  # fmt: skip


def recreate(log: Path, data: bytes, *, same_inode: bool, tries: int = 200) -> bool:
    """Remove ``log`` and create it anew with ``data``. ``same_inode``: again until the new
    file gets the old inode number (ext4 hands a freed number out again, usually at once);
    whether it did (False: the filesystem never reused it within ``tries``)."""
    old = log.stat().st_ino
    for _ in range(tries if same_inode else 1):
        log.unlink()
        log.write_bytes(data)
        if log.stat().st_ino == old:
            return True
    return False


def give_position_inode(state: Path, boot_id: str, log: Path) -> None:
    """Force what :func:`recreate` could not get from the filesystem: the saved position of
    ``log`` now names the inode the file at ``log`` has (device and inode only: its birth
    time and fingerprint stay the old file's), as an inode number handed out again would."""
    store = StateStore(state)
    try:
        raw, _ = store.boot_value(NAME, boot_id)
        assert raw is not None, "no position saved"
        saved = msgspec.json.decode(raw, type=PositionFile)
        assert saved.file is not None
        st = log.stat()
        old = saved.file.ino
        reached = saved.reached
        moved = msgspec.structs.replace(
            saved,
            file=msgspec.structs.replace(saved.file, dev=st.st_dev, ino=st.st_ino),
            handed=tuple(
                msgspec.structs.replace(p, ino=st.st_ino) if p.ino == old else p
                for p in saved.handed
            ),
            reached=None
            if reached is None
            else msgspec.structs.replace(reached, dev=st.st_dev, ino=st.st_ino),
        )
        store.put_boot_value(NAME, boot_id, msgspec.json.encode(moved))
    finally:
        store.close()


def running_position(state: Path) -> PositionFile | None:
    """The kernel-log position the agent running with the state dir ``state`` last wrote
    (read only: its store is left alone)."""
    db = sqlite3.connect(f"file:{state / DB_NAME}?mode=ro", uri=True, timeout=10.0)
    try:
        row = db.execute("SELECT value FROM boot_state WHERE name = ?", (NAME,)).fetchone()
    finally:
        db.close()
    return None if row is None else msgspec.json.decode(row[0], type=PositionFile)
